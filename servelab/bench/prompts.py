"""Prompts of a given token length for a load test, and the planned requests of a benchmark.

A workload spec gives arrival times and (prompt, output) token lengths. With the server's
tokenizer (``--tokenizer DIR``, a checkpoint folder), each prompt is cut from the request's
own text (or a GSM8K corpus when the workload has none) so that it encodes to exactly the
planned length, counting the BOS token the tokenizer adds (decode and re-encode can merge
tokens at the cut, so the cut is adjusted until the count matches; the few that cannot be
matched exactly are reported). ``prompt_format="ids"`` sends the token ids themselves (the
OpenAI API accepts them): exact for any tokenizer with a large enough vocabulary. Without a
tokenizer, text is synthesised as N common words, about one token each for the usual BPE
vocabularies; the server's ``usage.prompt_tokens`` then gives the real count.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servelab.core.errors import UserError

_WORDS = ("the", "of", "and", "to", "in", "is", "for", "on", "with", "as", "at", "by", "from", "it", "an", "be",
          "this", "that", "are", "was", "or", "not", "but", "all", "can", "one", "has", "had", "we", "you")
_MAX_ADJUST = 12


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    index: int
    arrival_s: float  # relative to the benchmark's start
    prompt: str | list[int]
    prompt_len: int  # planned prompt tokens (what the server should count)
    output_len: int  # max_tokens (with ignore_eos: the exact output length)
    priority: int = 0
    slo: dict | None = None


class PromptMaker:
    """Makes prompts of an exact token count from a tokenizer and a corpus of token ids."""

    def __init__(self, tokenizer, corpus_texts: list[str]) -> None:
        self.tokenizer = tokenizer
        self.num_special = len(tokenizer.encode("a").ids) - len(tokenizer.encode("a", add_special_tokens=False).ids)
        ids = [i for t in corpus_texts for i in tokenizer.encode(t, add_special_tokens=False).ids]
        if not ids:
            raise UserError("the prompt corpus encodes to no tokens")
        self.corpus = np.asarray(ids, dtype=np.int64)
        self.num_inexact = 0

    def text(self, length: int, offset: int, text: str | None = None) -> str:
        """A text that encodes to ``length`` tokens (BOS included), adjusted at the cut."""
        body = max(length - self.num_special, 1)
        source = self.tokenizer.encode(text, add_special_tokens=False).ids if text else []
        if len(source) < body:
            start = offset % self.corpus.size
            source = source + np.resize(np.roll(self.corpus, -start), body * 2).tolist()
        cut = body
        best, best_err = None, None
        for _ in range(_MAX_ADJUST):
            candidate = self.tokenizer.decode(source[:cut])
            n = len(self.tokenizer.encode(candidate).ids)
            err = n - length
            if best_err is None or abs(err) < abs(best_err):
                best, best_err = candidate, err
            if err == 0:
                return candidate
            cut = max(1, min(len(source), cut - err))
        self.num_inexact += 1
        return best


def corpus_texts(data_dir: Path | None = None, limit: int = 500) -> list[str]:
    """GSM8K questions and answers: the text prompts are cut from when a workload has none."""
    import json

    from servelab.paths import gsm8k_path

    path = gsm8k_path() if data_dir is None else Path(data_dir) / "datasets" / gsm8k_path().name
    texts = []
    try:
        with path.open(encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                texts.append(row["question"] + "\n" + row["answer"])
                if len(texts) >= limit:
                    break
    except (OSError, ValueError, KeyError) as e:
        raise UserError(f"prompt corpus {path}: unreadable ({type(e).__name__})") from None
    return texts


def synthetic_text(length: int, offset: int) -> str:
    return " ".join(_WORDS[(offset + i) % len(_WORDS)] for i in range(max(length, 1)))


def load_tokenizer(path: Path):
    from tokenizers import Tokenizer

    file = Path(path) / "tokenizer.json" if Path(path).is_dir() else Path(path)
    if not file.is_file():
        raise UserError(f"--tokenizer {path}: no tokenizer.json there")
    try:
        return Tokenizer.from_file(str(file))
    except Exception as e:  # tokenizers raises a bare Exception on a bad file
        raise UserError(f"--tokenizer {path}: cannot read ({e})") from None


def plan_requests(specs, arrivals_s: np.ndarray, *, tokenizer=None, prompt_format: str = "text",
                  corpus_texts: list[str] | None = None) -> tuple[list[PlannedRequest], int]:
    """One PlannedRequest per spec at ``arrivals_s``; returns them and the number of prompts
    whose token count could not be matched exactly."""
    if prompt_format not in ("text", "ids"):
        raise UserError(f"--prompt-format must be text or ids, got {prompt_format!r}")
    maker = PromptMaker(tokenizer, corpus_texts or []) if tokenizer is not None else None
    if prompt_format == "ids" and maker is None:
        raise UserError("--prompt-format ids needs --tokenizer (the ids must be the server's)")
    out, offset = [], 0
    for i, (spec, t) in enumerate(zip(specs, arrivals_s)):
        n = spec.num_prompt_tokens
        if maker is None:
            prompt: str | list[int] = synthetic_text(n, offset)
        elif prompt_format == "ids":
            prompt = _exact_ids(maker, n, offset, spec.prompt_text)
        else:
            prompt = maker.text(n, offset, spec.prompt_text)
        offset += n
        slo = None
        if spec.slo is not None:
            slo = {k: v for k, v in (("ttft_s", spec.slo.ttft_s), ("tpot_s", spec.slo.tpot_s),
                                     ("tbt_s", spec.slo.tbt_s)) if v is not None}
        out.append(PlannedRequest(i, float(t), prompt, n, spec.num_output_tokens, spec.priority, slo))
    return out, (maker.num_inexact if maker is not None else 0)


def _exact_ids(maker: PromptMaker, length: int, offset: int, text: str | None) -> list[int]:
    """Token ids sent as they are: BOS (when the tokenizer adds one) then corpus ids."""
    prefix = maker.tokenizer.encode("").ids  # the special tokens alone (BOS)
    body = length - len(prefix)
    if body <= 0:
        return list(prefix[:length])
    source = maker.tokenizer.encode(text, add_special_tokens=False).ids if text else []
    if len(source) < body:
        source = source + np.resize(np.roll(maker.corpus, -(offset % maker.corpus.size)), body).tolist()
    return list(prefix) + list(source[:body])
