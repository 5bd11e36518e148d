"""Shared fixtures for engine tests: one trained tokenizer, tiny checkpoints built on demand."""

from __future__ import annotations

import pytest
import torch

from servelab.engine.tiny_model import gsm8k_texts, make_tiny_model, train_tokenizer


@pytest.fixture(scope="session", autouse=True)
def _few_threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tokenizer():
    return train_tokenizer(gsm8k_texts(limit=3000), vocab_size=512)


@pytest.fixture(scope="session")
def make_checkpoint(tmp_path_factory, tokenizer):
    """make_checkpoint(**make_tiny_model kwargs) -> folder, cached per distinct kwargs."""
    made = {}

    def make(**kwargs):
        key = repr(sorted(kwargs.items()))
        if key not in made:
            folder = tmp_path_factory.mktemp("ckpt")
            made[key] = make_tiny_model(folder, tokenizer=tokenizer, **kwargs)
        return made[key]

    return make


@pytest.fixture(scope="session")
def prompts(tokenizer):
    texts = gsm8k_texts(limit=16)
    return [tokenizer.encode(t).ids[: 5 + 3 * i] for i, t in enumerate(texts)]
