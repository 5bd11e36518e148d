"""AlignedServe on the real engine (prefill and decode instances in one process, the pool in
host memory, real KV copies pool -> prefill buffer -> decode and back on eviction): every
request gives the greedy tokens of running alone."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine_pairs import GREEDY, assert_tokens_of_running_alone, engine_config  # noqa: E402

from servelab.core.policy import POOL  # noqa: E402
from servelab.engine.cluster import EngineCluster  # noqa: E402


def _run(tiny_engine, burst_specs, spec, num_blocks):
    engine = EngineCluster(tiny_engine[0], spec, engine_config(tiny_engine[0], num_blocks), num_instances=2,
                           kv_pool_bytes=1 << 26)
    cluster, states = engine.build(lambda s: GREEDY)
    result = cluster.run(burst_specs)
    return engine.result_of(cluster, states, result.wall_s, result.transfers, result.links), cluster.router


def test_batches_through_pool_and_prefetch_buffer_give_the_tokens_of_running_alone(tiny_engine, burst_specs,
                                                                                   alone_tokens):
    res, router = _run(tiny_engine, burst_specs, "alignedserve:min_batch=3,max_wait_s=0", 128)
    assert_tokens_of_running_alone(res, alone_tokens)
    hops = {(src, dst) for src, dst, *_ in res.transfers}
    assert {(0, POOL), (POOL, 0), (0, 1)} <= hops  # prefill -> pool -> prefill's buffer -> decode
    assert router.stats.batch_sizes and sum(router.stats.batch_sizes) + router.stats.num_dynamic == len(burst_specs)


def test_evictions_to_the_requests_buffer_keep_the_tokens(tiny_engine, burst_specs, alone_tokens):
    # a decode KV cache of 20 blocks of 4 tokens cannot hold the batch as it grows: case 3 evicts
    res, router = _run(tiny_engine, burst_specs,
                       "alignedserve:min_batch=8,max_wait_s=0,block_fraction=1.0,growth_tokens=0", 20)
    assert_tokens_of_running_alone(res, alone_tokens)
    assert router.stats.num_evictions > 0
    assert any(src == 1 and dst in (0, POOL) for src, dst, *_ in res.transfers)


def test_without_prefetch_batches_go_from_the_pool_to_the_decode_gpu(tiny_engine, burst_specs, alone_tokens):
    res, _ = _run(tiny_engine, burst_specs, "alignedserve:min_batch=3,max_wait_s=0,prefetch=false", 128)
    assert_tokens_of_running_alone(res, alone_tokens)
    hops = {(src, dst) for src, dst, *_ in res.transfers}
    assert (POOL, 1) in hops and (0, 1) not in hops
