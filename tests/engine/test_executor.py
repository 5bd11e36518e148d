"""The engine loop: policies from the registry drive the real model; outputs match running alone."""

from __future__ import annotations

import pytest

from servelab.core.request import RequestSpec, RequestStatus
from servelab.engine.loader import load_checkpoint
from servelab.engine.sampling import SamplingParams
from servelab.engine.serve_loop import EngineConfig, EngineInstance

MAX_TOKENS = 6
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def loaded(make_checkpoint):
    return load_checkpoint(make_checkpoint())


def _kv_bytes(loaded, num_blocks: int, block_size: int = 4) -> int:
    c = loaded.config
    return num_blocks * 2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim * 4


def _specs(prompts, arrivals=None):
    return [RequestSpec(i, arrivals[i] if arrivals else 0.0, len(p), MAX_TOKENS, prompt_token_ids=tuple(p))
            for i, p in enumerate(prompts)]


@pytest.fixture(scope="module")
def alone(loaded, prompts):
    """Greedy outputs of each prompt run by itself (vllm policy, one request per run)."""
    engine = EngineInstance(loaded, "vllm", EngineConfig(kv_budget_bytes=_kv_bytes(loaded, 64), block_size=4))
    out = {}
    for i, p in enumerate(prompts[:12]):
        res = engine.run([RequestSpec(i, 0.0, len(p), MAX_TOKENS, prompt_token_ids=tuple(p))], GREEDY)
        out[i] = res.requests[0].output_token_ids
    return out


@pytest.mark.parametrize("policy", ["vllm", "sarathi:token_budget=16", "static:batch_size=4", "multibin:batch_size=4",
                                    "bucketserve:padded=true"])
def test_policies_finish_everything_and_match_running_alone(loaded, prompts, alone, policy):
    engine = EngineInstance(loaded, policy, EngineConfig(kv_budget_bytes=_kv_bytes(loaded, 200), block_size=4,
                                                         max_batch_tokens=64, max_num_seqs=8))
    arrivals = [0.0] * 6 + [0.002 * k for k in range(6)]  # some arrive while others run
    res = engine.run(_specs(prompts[:12], arrivals), GREEDY)
    assert all(r.status is RequestStatus.FINISHED for r in res.requests), [r.finish_reason for r in res.requests]
    assert res.num_used_blocks_after == 0
    assert res.summary.num_completed == 12 and res.summary.num_output_tokens == 12 * MAX_TOKENS
    for r in res.requests:
        assert r.output_token_ids == alone[r.request_id], f"{policy}: request {r.request_id}"
    if policy.startswith(("static", "multibin", "bucketserve")):
        assert res.summary.padding_waste > 0  # the padded steps really ran padded


def test_request_that_never_fits_is_rejected_others_complete(loaded, prompts):
    # 12 blocks of 4 tokens = 48 slots; prompt 15 has 50 tokens
    engine = EngineInstance(loaded, "vllm", EngineConfig(kv_budget_bytes=_kv_bytes(loaded, 12), block_size=4,
                                                         watermark=0.0))
    chosen = [prompts[0], prompts[1], prompts[15]]
    res = engine.run(_specs(chosen), GREEDY)
    status = {r.request_id: r.status for r in res.requests}
    assert status == {0: RequestStatus.FINISHED, 1: RequestStatus.FINISHED, 2: RequestStatus.REJECTED}
    assert "KV blocks" in res.requests[2].finish_reason
    assert res.num_used_blocks_after == 0
    assert res.summary.num_rejected == 1


def test_small_kv_budget_preempts_and_still_matches(loaded, prompts, alone):
    """Too little KV for everyone at once: vLLM preempts (recompute); outputs stay identical."""
    engine = EngineInstance(loaded, "vllm", EngineConfig(kv_budget_bytes=_kv_bytes(loaded, 24), block_size=4,
                                                         watermark=0.0))
    res = engine.run(_specs(prompts[:8]), GREEDY)
    assert all(r.status is RequestStatus.FINISHED for r in res.requests)
    assert res.summary.num_preemptions_recompute > 0
    for r in res.requests:
        assert r.output_token_ids == alone[r.request_id]
    assert res.num_used_blocks_after == 0


def test_swap_preemption_copies_kv(loaded, prompts, alone):
    engine = EngineInstance(loaded, "vllm:preemption=swap",
                            EngineConfig(kv_budget_bytes=_kv_bytes(loaded, 24), block_size=4, watermark=0.0,
                                         num_host_blocks=64))
    res = engine.run(_specs(prompts[:8]), GREEDY)
    assert res.summary.num_preemptions_swap > 0
    for r in res.requests:
        assert r.output_token_ids == alone[r.request_id]
    assert res.num_used_blocks_after == 0


def test_max_tokens_and_stop_strings(loaded, prompts, alone):
    tok = loaded.tokenizer
    full_text = tok.decode(alone[3])
    stop = full_text[len(full_text) // 2:len(full_text) // 2 + 2]
    assert stop.strip(), "pick a prompt whose output has visible text"
    params = {0: SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True),
              3: SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, stop=(stop,))}
    specs = [RequestSpec(0, 0.0, len(prompts[0]), 3, prompt_token_ids=tuple(prompts[0])),
             RequestSpec(3, 0.0, len(prompts[3]), MAX_TOKENS, prompt_token_ids=tuple(prompts[3]))]
    engine = EngineInstance(loaded, "vllm", EngineConfig(kv_budget_bytes=_kv_bytes(loaded, 64), block_size=4))
    res = engine.run(specs, params)
    by_id = {r.request_id: r for r in res.requests}
    assert by_id[0].num_generated_tokens == 3 and by_id[0].finish_reason == "length"
    assert by_id[0].output_token_ids == alone[0][:3]
    assert by_id[3].finish_reason == "stop_string"
    assert res.texts[3] == full_text[:full_text.index(stop)]
    assert by_id[3].num_generated_tokens <= MAX_TOKENS


def test_stop_token_and_prompt_too_long(loaded, prompts, alone):
    stop_id = alone[2][2]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, stop_token_ids=(stop_id,))
    long_prompt = tuple(range(3, 3 + loaded.config.max_position))
    specs = [RequestSpec(2, 0.0, len(prompts[2]), MAX_TOKENS, prompt_token_ids=tuple(prompts[2])),
             RequestSpec(9, 0.0, len(long_prompt), MAX_TOKENS, prompt_token_ids=long_prompt)]
    engine = EngineInstance(loaded, "vllm", EngineConfig(kv_budget_bytes=_kv_bytes(loaded, 64), block_size=4))
    res = engine.run(specs, params)
    by_id = {r.request_id: r for r in res.requests}
    assert by_id[2].finish_reason == "stop_token"
    assert by_id[2].output_token_ids == alone[2][:alone[2].index(stop_id) + 1]
    assert by_id[9].status is RequestStatus.REJECTED and "exceeds max_model_len" in by_id[9].finish_reason


def test_bad_policy_spec_is_a_clear_error(loaded):
    with pytest.raises(Exception, match="nosuchpolicy"):
        EngineInstance(loaded, "nosuchpolicy", EngineConfig(kv_budget_bytes=_kv_bytes(loaded, 8), block_size=4))
