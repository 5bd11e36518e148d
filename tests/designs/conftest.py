"""Fixtures for the designs' engine tests (module-scoped; torch imported only by tests that use them):
a tiny GSM8K checkpoint, a burst of eight GSM8K prompts, and each prompt's tokens when run alone."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    """(loaded checkpoint, tokenizer); torch on one thread meanwhile."""
    torch = pytest.importorskip("torch")
    from engine_pairs import tiny_checkpoint

    previous = torch.get_num_threads()
    yield tiny_checkpoint(tmp_path_factory.mktemp("ckpt"))
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def burst_specs(tiny_engine):
    from engine_pairs import gsm8k_burst

    return gsm8k_burst(tiny_engine[1])


@pytest.fixture(scope="module")
def alone_tokens(tiny_engine, burst_specs):
    from engine_pairs import tokens_alone

    return tokens_alone(tiny_engine[0], burst_specs)
