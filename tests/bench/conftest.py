"""A tiny checkpoint for the benchmark tests (its tokenizer gives exact prompt lengths)."""

from __future__ import annotations

import pytest
import torch

from servelab.engine.tiny_model import gsm8k_texts, make_tiny_model, train_tokenizer


@pytest.fixture(scope="session")
def bench_checkpoint(tmp_path_factory):
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    tokenizer = train_tokenizer(gsm8k_texts(limit=3000), vocab_size=512)
    yield make_tiny_model(tmp_path_factory.mktemp("bench-ckpt"), tokenizer=tokenizer, max_position=512)
    torch.set_num_threads(previous)
