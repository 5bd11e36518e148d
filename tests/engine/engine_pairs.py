"""Helpers for the designs that move requests between engine instances (DynaServe, AlignedServe):
a tiny GSM8K checkpoint, a KV budget in blocks, a burst of GSM8K prompts, each request's tokens
when it runs alone, and the check that a cluster run gives exactly those (greedy decoding)."""

from __future__ import annotations

import torch

from servelab.core.request import RequestSpec, RequestStatus
from servelab.engine.cluster import EngineCluster, EngineConfig
from servelab.engine.loader import load_checkpoint
from servelab.engine.sampling import SamplingParams
from servelab.engine.tiny_model import gsm8k_texts, make_tiny_model, train_tokenizer

MAX_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def tiny_checkpoint(folder):
    """(loaded checkpoint, tokenizer) of a tiny model with a 512-token GSM8K tokenizer; torch on one
    thread while it is used (restore with ``torch.set_num_threads``)."""
    torch.set_num_threads(1)
    tok = train_tokenizer(gsm8k_texts(limit=500), vocab_size=512)
    return load_checkpoint(make_tiny_model(folder, tokenizer=tok)), tok


def engine_config(loaded, num_blocks: int = 128, block_size: int = 4) -> EngineConfig:
    """A KV budget of ``num_blocks`` blocks of ``block_size`` tokens (float32 K and V, every layer)."""
    c = loaded.config
    return EngineConfig(kv_budget_bytes=num_blocks * 2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim * 4,
                        block_size=block_size, max_batch_tokens=64, max_num_seqs=8)


def gsm8k_burst(tok, n: int = 8) -> list[RequestSpec]:
    """``n`` GSM8K prompts of 12, 15, 18, ... tokens, 1 ms apart."""
    prompts = [tok.encode(t).ids[: 12 + 3 * i] for i, t in enumerate(gsm8k_texts(limit=n))]
    return [RequestSpec(i, 0.001 * i, len(p), MAX_TOKENS, prompt_token_ids=tuple(p)) for i, p in enumerate(prompts)]


def tokens_alone(loaded, specs, num_blocks: int = 128) -> dict[int, list[int]]:
    engine = EngineCluster(loaded, "vllm", engine_config(loaded, num_blocks))
    return {s.request_id: engine.run([s], GREEDY).requests[0].output_token_ids for s in specs}


def assert_tokens_of_running_alone(res, alone) -> None:
    """Every request finished with its alone tokens, and no KV block is left in use."""
    assert all(r.status is RequestStatus.FINISHED for r in res.requests), [r.finish_reason for r in res.requests]
    assert {r.request_id: r.output_token_ids for r in res.requests} == alone
    assert res.num_used_blocks_after == 0
