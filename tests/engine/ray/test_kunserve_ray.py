"""KunServe's drop -> pipeline group -> restore -> split with each instance a Ray actor.

As tests/engine/test_kunserve_engine.py, on ``backend="ray"``: two actors of a 4-layer tiny
model serve requests; mid-run both drop half their layers (freed in the actor) and form one
group whose step runs stage 0 in actor 0 and stage 1 in actor 1 (the hidden state handed on
as an object ref); each running request's KV is exchanged actor to actor; both restore their
layers from the peer's actor; the split copies each request's KV back whole. Greedy tokens
equal those of running alone and no KV block is left.
"""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from drop_restore_router import NUM_LAYERS  # noqa: E402 (registers test_engine_drop_restore)
from servelab.core.request import RequestSpec, RequestStatus  # noqa: E402
from servelab.engine.cluster import EngineCluster, EngineConfig  # noqa: E402
from servelab.engine.loader import load_checkpoint  # noqa: E402
from servelab.engine.sampling import SamplingParams  # noqa: E402

MAX_TOKENS = 24
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def loaded(make_checkpoint):
    return load_checkpoint(make_checkpoint(num_layers=NUM_LAYERS))


def _config(loaded, num_blocks=64, block_size=4):
    c = loaded.config
    return EngineConfig(kv_budget_bytes=num_blocks * 2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim * 4,
                        block_size=block_size, max_batch_tokens=64, max_num_seqs=8)


@pytest.mark.slow
@pytest.mark.parametrize("microbatches", [1, 3])
def test_drop_group_restore_split_across_actors_gives_the_tokens_of_running_alone(ray_session, loaded, prompts,
                                                                                   microbatches):
    specs = [RequestSpec(i, 0.0005 * i, len(p), MAX_TOKENS, prompt_token_ids=tuple(p))
             for i, p in enumerate(prompts[:8])]
    single = EngineCluster(loaded, "vllm", _config(loaded))
    alone = {s.request_id: single.run([s], GREEDY).requests[0].output_token_ids for s in specs}
    engine = EngineCluster(loaded, "vllm", _config(loaded), num_instances=2,
                           router=f"test_engine_drop_restore:microbatches={microbatches}", layer_ranges=True,
                           backend="ray")
    try:
        cluster, states = engine.build(lambda spec: GREEDY)
        run = cluster.run(specs)
        res = engine.result_of(cluster, states, run.wall_s, run.transfers, run.links)
        factory = engine.factory
        held = [factory.held_layers(iid) for iid in (0, 1)]
    finally:
        engine.close()

    assert all(r.status is RequestStatus.FINISHED for r in res.requests), [r.finish_reason for r in res.requests]
    assert {r.request_id: r.output_token_ids for r in res.requests} == alone
    assert res.num_used_blocks_after == 0
    kinds = [kind for _, kind, _ in cluster.reconfig.events_log]
    assert kinds[:3] == ["drop", "drop", "form"] and kinds.count("restored") == 2 and "split" in kinds
    assert all(n > 0 for n in cluster.router.in_flight_at_drop)
    group = cluster.reconfig.pipeline_report()[0]
    assert group["steps"] > 0 and group["ended_s"] is not None
    (executor,) = factory.group_executors
    assert type(executor).__name__ == "RayPipelineExecutor" and executor.num_microbatches == microbatches
    # the hand-off overhead is measured on one-microbatch steps only (several overlap in the actors)
    one_each = len(executor.handoff_s) == group["steps"]
    assert one_each if microbatches == 1 else len(executor.handoff_s) < group["steps"]
    assert executor.exchanged_bytes > 0 and executor.split_bytes > 0 and all(b > 0 for b in executor.hidden_bytes)
    assert executor.num_gpu_blocks == 2 * engine.num_gpu_blocks
    per_layer = sum(p.numel() * p.element_size() for p in loaded.model.layers[0].parameters())
    assert factory.dropped_bytes == factory.restored_bytes == 2 * (NUM_LAYERS // 2) * per_layer
    assert held == [list(range(NUM_LAYERS))] * 2  # the actors hold every layer again
    for iid in (0, 1):
        assert cluster.drivers[iid].spec.layers is None
        assert cluster.drivers[iid].runtime.blocks.num_used_gpu_blocks == 0
