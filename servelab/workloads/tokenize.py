"""Offline tokenisers for turning dataset text into token counts (no downloads possible).

``train_bpe_tokenizer`` trains a byte-level BPE (GPT-2 style pre-tokenisation, full
256-byte initial alphabet, so any text encodes) with the ``tokenizers`` package. Training
is deterministic: BPE merges are chosen by count with a fixed tie-break, and the only
randomness, the optional subsample of ``max_texts`` training texts, comes from ``seed``.
On the 7,473 GSM8K rows (questions + answers) training takes about 1 s on one CPU core.

``tokenizers`` is an optional dependency (the ``engine`` extra), so it is imported inside
the functions: the simulator imports this package without it. Nothing is cached on disk;
call ``tokenizer.save(path)`` and ``load_tokenizer(path)`` to reuse one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Tokenizer


def _require_tokenizers():
    try:
        import tokenizers
    except ImportError as err:  # pragma: no cover - depends on the install
        raise ImportError("tokenising text needs the 'tokenizers' package (pip install servelab[engine])") from err
    return tokenizers


def train_bpe_tokenizer(texts: Sequence[str], vocab_size: int = 8000, *, seed: int = 0,
                        max_texts: int | None = None, min_frequency: int = 2) -> Tokenizer:
    """Train a byte-level BPE tokenizer on ``texts`` (a seeded subsample if ``max_texts``)."""
    if vocab_size < 257:
        raise ValueError(f"vocab_size must be >= 257 (256 bytes + 1), got {vocab_size}")
    if not texts:
        raise ValueError("cannot train a tokenizer on no texts")
    tk = _require_tokenizers()
    if max_texts is not None and max_texts < len(texts):
        picked = np.random.default_rng(seed).choice(len(texts), size=max_texts, replace=False)
        texts = [texts[i] for i in np.sort(picked)]
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(list(texts), trainer=trainer)
    return tokenizer


def load_tokenizer(path: Path | str) -> Tokenizer:
    """Load a ``tokenizer.json`` (ours, or any Hugging Face fast tokenizer file)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such tokenizer file")
    return _require_tokenizers().Tokenizer.from_file(str(path))


def count_tokens(tokenizer: Tokenizer, texts: Sequence[str]) -> np.ndarray:
    """Token count of each text (no special tokens added), as int64."""
    encodings = tokenizer.encode_batch(list(texts), add_special_tokens=False)
    return np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
