"""Loaders for length-only datasets (no arrival times): arXiv summarization, GSM8K.

They return a ``LengthTable`` that a ``LengthSource`` (``EmpiricalLengths``) samples and an
arrival process times; see ``workload.build_workload``. Errors name file and line.

GSM8K ships text, not lengths: the prompt is the ``question`` (kept as the prompt text)
and the output length is the token count of the reference ``answer``. With no tokenizer
given, a byte-level BPE (8,000 tokens) is trained on the file's own questions and answers;
that is deterministic, so lengths are reproducible, but they are counts under that
tokenizer, not under any particular model's. Pass a ``Tokenizer`` to count with another. The trained
tokenizer's counts are cached per machine (``length_cache``), keyed by the file's bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from servelab.core.errors import shown
from servelab.workloads import length_cache
from servelab.workloads._parse import fail, int_column, read_csv, read_jsonl
from servelab.workloads.lengths import LengthTable
from servelab.workloads.tokenize import count_tokens, train_bpe_tokenizer

if TYPE_CHECKING:
    from tokenizers import Tokenizer


def load_arxiv_lengths(path: Path | str) -> LengthTable:
    """Vidur's processed arXiv summarization lengths: num_prefill_tokens, num_decode_tokens."""
    table = read_csv(path, ("num_prefill_tokens", "num_decode_tokens"))
    prompt = int_column(table.column("num_prefill_tokens"), "num_prefill_tokens", table.path, table.line_numbers, 1)
    output = int_column(table.column("num_decode_tokens"), "num_decode_tokens", table.path, table.line_numbers, 1)
    return LengthTable(prompt, output, None, "arxiv")


def load_gsm8k(path: Path | str, tokenizer: Tokenizer | None = None, *, vocab_size: int = 8000) -> LengthTable:
    """GSM8K JSONL (question, answer) -> lengths under ``tokenizer`` (trained here if None)."""
    path, records, lines = read_jsonl(path, ("question", "answer"))
    for record, line in zip(records, lines):
        for key in ("question", "answer"):
            if not isinstance(record[key], str) or not record[key].strip():
                raise fail(path, line, f"{key} must be a non-empty string, got {shown(record[key])}")
    questions = [r["question"] for r in records]
    answers = [r["answer"] for r in records]
    if tokenizer is not None:
        return LengthTable(count_tokens(tokenizer, questions), count_tokens(tokenizer, answers), tuple(questions), "gsm8k")

    def train_and_count():
        trained = train_bpe_tokenizer(questions + answers, vocab_size)
        return count_tokens(trained, questions), count_tokens(trained, answers)

    prompt, output = length_cache.counts(path, f"gsm8k-bpe{vocab_size}", train_and_count)  # once per machine
    if len(prompt) != len(questions) or len(output) != len(answers):  # a hash collision is all that could do this
        prompt, output = train_and_count()
    return LengthTable(prompt, output, tuple(questions), "gsm8k")
