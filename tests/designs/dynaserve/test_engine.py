"""DynaServe on the real engine (two instances in one process, real KV copies): a request split
inside its prefill and one split inside its decode give the greedy tokens of running alone,
and the dynamic router (its profile tables learnt from measured steps) does too."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from servelab.core.request import RequestSpec, RequestStatus  # noqa: E402
from servelab.engine.cluster import EngineCluster, EngineConfig  # noqa: E402
from servelab.engine.loader import load_checkpoint  # noqa: E402
from servelab.engine.sampling import SamplingParams  # noqa: E402
from servelab.engine.tiny_model import gsm8k_texts, make_tiny_model, train_tokenizer  # noqa: E402

MAX_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
FIXED = "dynaserve:split=fixed,pairing=fixed,min_segment_tokens=0,margin_tokens=0"


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    tok = train_tokenizer(gsm8k_texts(limit=500), vocab_size=512)
    yield load_checkpoint(make_tiny_model(tmp_path_factory.mktemp("ckpt"), tokenizer=tok)), tok
    torch.set_num_threads(previous)


def _config(loaded, num_blocks=128, block_size=4):
    c = loaded.config
    return EngineConfig(kv_budget_bytes=num_blocks * 2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim * 4,
                        block_size=block_size, max_batch_tokens=64, max_num_seqs=8)


@pytest.fixture(scope="module")
def specs(loaded):
    _, tok = loaded
    texts = gsm8k_texts(limit=8)
    prompts = [tok.encode(t).ids[: 12 + 3 * i] for i, t in enumerate(texts)]
    return [RequestSpec(i, 0.001 * i, len(p), MAX_TOKENS, prompt_token_ids=tuple(p)) for i, p in enumerate(prompts)]


@pytest.fixture(scope="module")
def alone(loaded, specs):
    engine = EngineCluster(loaded[0], "vllm", _config(loaded[0]))
    return {s.request_id: engine.run([s], GREEDY).requests[0].output_token_ids for s in specs}


def _check(res, alone):
    assert all(r.status is RequestStatus.FINISHED for r in res.requests), [r.finish_reason for r in res.requests]
    assert {r.request_id: r.output_token_ids for r in res.requests} == alone
    assert res.num_used_blocks_after == 0


@pytest.mark.parametrize("fraction, stream", [(-0.5, 0), (-0.5, 4), (0.5, 0), (0.5, 4)],
                         ids=["in-prefill-bulk", "in-prefill-streamed", "in-decode-bulk", "in-decode-streamed"])
def test_a_split_anywhere_gives_the_tokens_of_running_alone(loaded, specs, alone, fraction, stream):
    router = f"{FIXED},decode_fraction={fraction},stream_kv_tokens={stream},stream_decode_splits=true"
    engine = EngineCluster(loaded[0], "dynaserve:fallback_budget=8", _config(loaded[0]), num_instances=2,
                           router=router)
    res = engine.run(specs, GREEDY)
    _check(res, alone)
    assert {r.num_transfers for r in res.requests} == {1}  # every request crossed once, at its split
    assert len(res.transfers) == len(specs)


def test_the_dynamic_router_on_the_engine_gives_the_same_tokens(loaded, specs, alone):
    engine = EngineCluster(loaded[0], "dynaserve:fallback_budget=16", _config(loaded[0]), num_instances=2,
                           router="dynaserve:min_segment_tokens=2")
    res = engine.run(specs + [RequestSpec(100 + s.request_id, 0.05 + 0.001 * s.request_id, s.num_prompt_tokens,
                                          MAX_TOKENS, prompt_token_ids=s.prompt_token_ids) for s in specs], GREEDY)
    assert all(r.status is RequestStatus.FINISHED for r in res.requests)
    outputs = {r.request_id: r.output_token_ids for r in res.requests}
    assert all(outputs[i] == alone[i] and outputs[100 + i] == alone[i] for i in alone)
    assert any(r.num_transfers for r in res.requests)
