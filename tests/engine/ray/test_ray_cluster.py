"""The engine cluster on Ray: each instance an actor, KV copied between actors for real.

P/D hand-offs (distserve), DynaServe splits inside the prefill and inside the decode (over
Ray's object store and over gloo) give the greedy tokens of one instance running each request
alone; an actor killed mid-run has its requests recomputed on the other instance, none lost.
One Ray session and one pair of actors serve the whole module (actors take ~10 s to start).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

ray = pytest.importorskip("ray")

from servelab.core.policy import POOL, ROUTERS, Move, Placement, Router  # noqa: E402
from servelab.core.request import RequestSpec, RequestStatus  # noqa: E402
from servelab.engine.cluster import EngineCluster, EngineConfig  # noqa: E402
from servelab.engine.loader import load_checkpoint  # noqa: E402
from servelab.engine.ray_backend import RayConfig  # noqa: E402
from servelab.engine.sampling import SamplingParams  # noqa: E402

MAX_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
FIXED = "dynaserve:split=fixed,pairing=fixed,min_segment_tokens=0,margin_tokens=0,stream_decode_splits=true"


@dataclass(frozen=True)
class _NoParams:
    pass


@ROUTERS.register("test_ray_via_pool")
class ViaPoolRouter(Router):
    """Instance 0 computes the prompt and two tokens, the KV parks in the driver's pool, then
    instance 1 takes it and decodes the rest."""

    Config = _NoParams

    def __init__(self, config: _NoParams = _NoParams()) -> None:
        self.config = config

    def on_arrival(self, now_s, request, cluster):
        return [Placement(request, 0, handoff_at_tokens=request.num_prompt_tokens + 2, handoff_target=POOL)]

    def on_moved(self, now_s, request, destination, cluster):
        return [Move(request, 1)] if destination == POOL else []


@pytest.fixture(scope="module")
def loaded(make_checkpoint):
    return load_checkpoint(make_checkpoint())


def _config(loaded, num_blocks=128, block_size=4):
    c = loaded.config
    return EngineConfig(kv_budget_bytes=num_blocks * 2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim * 4,
                        block_size=block_size, max_batch_tokens=64, max_num_seqs=8)


@pytest.fixture(scope="module")
def specs(prompts):
    return [RequestSpec(i, 0.001 * i, len(p) + 8, MAX_TOKENS, prompt_token_ids=tuple(prompts[-1][:8]) + tuple(p))
            for i, p in enumerate(prompts[:8])]


@pytest.fixture(scope="module")
def alone(loaded, specs):
    engine = EngineCluster(loaded, "vllm", _config(loaded))
    return {s.request_id: engine.run([s], GREEDY).requests[0].output_token_ids for s in specs}


@pytest.fixture(scope="module")
def on_ray(ray_session, loaded):
    """on_ray(policy, router=None, transport=...) -> an EngineCluster over the module's two actors."""
    workers = []

    def make(policy: str, router: str | None = None, transport: str = "auto") -> EngineCluster:
        return EngineCluster(loaded, policy, _config(loaded), num_instances=2, router=router, backend="ray",
                             ray_config=RayConfig(kv_transport=transport), kv_pool_bytes=64 << 20,
                             ray_workers=workers[0] if workers else None)

    yield make, workers
    if workers:
        workers[0].shutdown()


def _run(make_workers, specs, policy, router=None, transport="auto"):
    make, workers = make_workers
    engine = make(policy, router, transport)
    res = engine.run(specs, GREEDY)
    if not workers:
        workers.append(engine.ray_workers)
    return engine, res


def _same_as_alone(res, alone):
    assert all(r.status is RequestStatus.FINISHED for r in res.requests), [r.finish_reason for r in res.requests]
    assert res.outputs() == alone
    assert res.num_used_blocks_after == 0


def test_distserve_on_actors_gives_the_tokens_of_running_alone(on_ray, specs, alone):
    engine, res = _run(on_ray, specs, "distserve")
    _same_as_alone(res, alone)
    assert len(res.transfers) == len(specs) and all(s == 0 and d == 1 and b > 0 for s, d, _, _, b in res.transfers)
    pids = {info["pid"] for info in engine.ray_workers.info}
    assert len(pids) == 2 and os.getpid() not in pids  # two processes apart from this one


@pytest.mark.parametrize("fraction, stream, transport", [(-0.5, 4, "object_store"), (0.5, 0, "object_store"),
                                                        (-0.5, 4, "gloo"), (0.5, 0, "gloo")],
                         ids=["in-prefill-streamed-store", "in-decode-bulk-store", "in-prefill-streamed-gloo",
                              "in-decode-bulk-gloo"])
def test_a_dynaserve_split_on_actors_gives_the_tokens_of_running_alone(on_ray, specs, alone, fraction, stream,
                                                                       transport):
    router = f"{FIXED},decode_fraction={fraction},stream_kv_tokens={stream}"
    _, res = _run(on_ray, specs, "dynaserve:fallback_budget=8", router, transport)
    _same_as_alone(res, alone)
    assert {r.num_transfers for r in res.requests} == {1}
    chunks = sum(link["jobs"] for link in res.links.values())
    assert chunks > len(specs) if stream else chunks == len(specs)


def test_seeded_sampling_crosses_actors_with_its_generator(on_ray, loaded, specs):
    """temperature > 0 with a seed per request: a distserve hand-off carries the request's
    generator state, so the tokens are those of the in-process cluster (one shared sampler)."""
    params = {s.request_id: SamplingParams(temperature=0.9, top_k=50, seed=100 + s.request_id,
                                           max_tokens=MAX_TOKENS, ignore_eos=True) for s in specs}
    local = EngineCluster(loaded, "distserve", _config(loaded), num_instances=2).run(specs, params)
    make, workers = on_ray
    engine = make("distserve")
    res = engine.run(specs, params)
    if not workers:
        workers.append(engine.ray_workers)
    assert all(r.status is RequestStatus.FINISHED for r in res.requests)
    assert res.outputs() == local.outputs()
    assert len(res.transfers) == len(specs)


@pytest.mark.parametrize("transport", ["object_store", "gloo", "auto"])
def test_kv_parked_in_the_driver_pool_comes_back_intact(on_ray, specs, alone, transport):
    _, res = _run(on_ray, specs, "vllm", "test_ray_via_pool", transport)
    _same_as_alone(res, alone)
    assert sorted((src, dst) for src, dst, *_ in res.transfers) == [(POOL, 1)] * len(specs) + [(0, POOL)] * len(specs)
    assert all(r.instance_id == 1 for r in res.requests)


def test_an_actor_killed_mid_run_has_its_requests_recomputed_elsewhere(on_ray, specs, alone):
    """It kills one of the shared actors; the next cluster built replaces it."""
    make, workers = on_ray
    engine = make("vllm")
    if workers:
        engine.ray_workers.reset(0)
    cluster, states = engine.build(lambda spec: GREEDY)
    victim = cluster.drivers[1].executor
    launches = []
    launch = victim.launch

    def launch_then_die(applied, blocks):
        launches.append(len(applied.batch))
        if len(launches) == 2:  # after one step ran there: its requests hold KV on the actor
            ray.kill(victim.worker, no_restart=True)
        return launch(applied, blocks)

    victim.launch = launch_then_die
    result = cluster.run(specs)
    res = engine.result_of(cluster, states, result.wall_s)
    assert result.conserved and 1 not in cluster.active
    assert [kind for _, kind, _ in cluster.reconfig.events_log] == ["fail"]
    moved = [r for r in res.requests if r.num_preemptions]  # re-queued: recomputed on instance 0
    assert moved and all(r.instance_id == 0 for r in moved)
    _same_as_alone(res, alone)
    if not workers:
        workers.append(engine.ray_workers)


def test_a_decode_actor_killed_while_kv_lands_on_it_leaves_nothing_lost(on_ray, specs, alone):
    """distserve: the decode instance dies as the third hand-off's KV is written into it; that
    transfer returns to the prefill instance, which finishes the request itself (no decode
    instance is left), as it does every later one."""
    make, _ = on_ray
    engine = make("distserve")  # its first build replaces the actor the previous test killed
    cluster, states = engine.build(lambda spec: GREEDY)
    victim = cluster.drivers[1].executor
    imports = []
    import_kv = victim.import_kv

    def import_then_die(block_ids, payload):
        imports.append(len(block_ids))
        if len(imports) == 3:
            ray.kill(victim.worker, no_restart=True)
        return import_kv(block_ids, payload)

    victim.import_kv = import_then_die
    result = cluster.run(specs)
    res = engine.result_of(cluster, states, result.wall_s)
    assert result.conserved and 1 not in cluster.active and res.num_used_blocks_after == 0
    finished = {r.request_id: r.output_token_ids for r in res.requests if r.status is RequestStatus.FINISHED}
    assert finished and finished == {i: alone[i] for i in finished}
    # those that were decoding on instance 1 went back to the router, which has no decode
    # instance left and runs them whole (recomputed) on the prefill instance: every one finishes
    assert len(finished) == len(specs)
    assert any(r.num_preemptions == 1 for r in res.requests)
