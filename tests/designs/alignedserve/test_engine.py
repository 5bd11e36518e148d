"""AlignedServe on the real engine (prefill and decode instances in one process, the pool in
host memory, real KV copies pool -> prefill buffer -> decode and back on eviction): every
request gives the greedy tokens of running alone."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from servelab.core.policy import POOL  # noqa: E402
from servelab.core.request import RequestSpec, RequestStatus  # noqa: E402
from servelab.engine.cluster import EngineCluster, EngineConfig  # noqa: E402
from servelab.engine.loader import load_checkpoint  # noqa: E402
from servelab.engine.sampling import SamplingParams  # noqa: E402
from servelab.engine.tiny_model import gsm8k_texts, make_tiny_model, train_tokenizer  # noqa: E402

MAX_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    tok = train_tokenizer(gsm8k_texts(limit=500), vocab_size=512)
    yield load_checkpoint(make_tiny_model(tmp_path_factory.mktemp("ckpt"), tokenizer=tok)), tok
    torch.set_num_threads(previous)


def _config(loaded, num_blocks):
    c = loaded.config
    return EngineConfig(kv_budget_bytes=num_blocks * 2 * c.num_layers * 4 * c.num_kv_heads * c.head_dim * 4,
                        block_size=4, max_batch_tokens=64, max_num_seqs=8)


@pytest.fixture(scope="module")
def specs(loaded):
    _, tok = loaded
    texts = gsm8k_texts(limit=8)
    prompts = [tok.encode(t).ids[: 12 + 3 * i] for i, t in enumerate(texts)]
    return [RequestSpec(i, 0.001 * i, len(p), MAX_TOKENS, prompt_token_ids=tuple(p)) for i, p in enumerate(prompts)]


@pytest.fixture(scope="module")
def alone(loaded, specs):
    engine = EngineCluster(loaded[0], "vllm", _config(loaded[0], 128))
    return {s.request_id: engine.run([s], GREEDY).requests[0].output_token_ids for s in specs}


def _run(loaded, specs, spec, num_blocks):
    engine = EngineCluster(loaded[0], spec, _config(loaded[0], num_blocks), num_instances=2, kv_pool_bytes=1 << 26)
    cluster, states = engine.build(lambda s: GREEDY)
    result = cluster.run(specs)
    return engine.result_of(cluster, states, result.wall_s, result.transfers, result.links), cluster.router


def _check(res, alone):
    assert all(r.status is RequestStatus.FINISHED for r in res.requests), [r.finish_reason for r in res.requests]
    assert {r.request_id: r.output_token_ids for r in res.requests} == alone
    assert res.num_used_blocks_after == 0


def test_batches_through_pool_and_prefetch_buffer_give_the_tokens_of_running_alone(loaded, specs, alone):
    res, router = _run(loaded, specs, "alignedserve:min_batch=3,max_wait_s=0", 128)
    _check(res, alone)
    hops = {(src, dst) for src, dst, *_ in res.transfers}
    assert {(0, POOL), (POOL, 0), (0, 1)} <= hops  # prefill -> pool -> prefill's buffer -> decode
    assert router.stats.batch_sizes and sum(router.stats.batch_sizes) + router.stats.num_dynamic == len(specs)


def test_evictions_to_the_requests_buffer_keep_the_tokens(loaded, specs, alone):
    # a decode KV cache of 20 blocks of 4 tokens cannot hold the batch as it grows: case 3 evicts
    res, router = _run(loaded, specs, "alignedserve:min_batch=8,max_wait_s=0,block_fraction=1.0,growth_tokens=0", 20)
    _check(res, alone)
    assert router.stats.num_evictions > 0
    assert any(src == 1 and dst in (0, POOL) for src, dst, *_ in res.transfers)


def test_without_prefetch_batches_go_from_the_pool_to_the_decode_gpu(loaded, specs, alone):
    res, _ = _run(loaded, specs, "alignedserve:min_batch=3,max_wait_s=0,prefetch=false", 128)
    _check(res, alone)
    hops = {(src, dst) for src, dst, *_ in res.transfers}
    assert (POOL, 1) in hops and (0, 1) not in hops
