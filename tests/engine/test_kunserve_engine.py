"""KunServe's drop -> pipeline group -> restore -> split on the real engine (issue 13 item 8).

Two instances of a 4-layer tiny model serve requests; mid-run both drop half their layers and
form one pipeline group (each running request's KV for the other stage's layers is copied
into that stage's cache), the group runs stage by stage, then each restores its layers by
copying the tensors from its peer and the group splits (each request's KV copied back whole).
Every request's greedy tokens equal those of running alone, and no KV block is left.
"""

from __future__ import annotations

import pytest

from drop_restore_router import NUM_LAYERS  # registers test_engine_drop_restore
from servelab.core.request import RequestSpec, RequestStatus
from servelab.engine.cluster import EngineCluster, EngineConfig
from servelab.engine.layer_range import _Dropped
from servelab.engine.loader import load_checkpoint
from servelab.engine.sampling import SamplingParams

MAX_TOKENS = 24
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def loaded(make_checkpoint):
    return load_checkpoint(make_checkpoint(num_layers=NUM_LAYERS))


def _config(loaded, num_blocks=64, block_size=4):
    c = loaded.config
    return EngineConfig(kv_budget_bytes=num_blocks * 2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim * 4,
                        block_size=block_size, max_batch_tokens=64, max_num_seqs=8)


def _specs(prompts, n=8):
    return [RequestSpec(i, 0.0005 * i, len(p), MAX_TOKENS, prompt_token_ids=tuple(p))
            for i, p in enumerate(prompts[:n])]


def test_drop_to_one_pipeline_group_and_restore_gives_the_tokens_of_running_alone(loaded, prompts):
    specs = _specs(prompts)
    single = EngineCluster(loaded, "vllm", _config(loaded))
    alone = {s.request_id: single.run([s], GREEDY).requests[0].output_token_ids for s in specs}
    engine = EngineCluster(loaded, "vllm", _config(loaded), num_instances=2, router="test_engine_drop_restore",
                           layer_ranges=True)
    cluster, states = engine.build(lambda spec: GREEDY)
    run = cluster.run(specs)
    res = engine.result_of(cluster, states, run.wall_s, run.transfers, run.links)

    assert all(r.status is RequestStatus.FINISHED for r in res.requests), [r.finish_reason for r in res.requests]
    assert {r.request_id: r.output_token_ids for r in res.requests} == alone
    assert res.num_used_blocks_after == 0
    kinds = [kind for _, kind, _ in cluster.reconfig.events_log]
    assert kinds[:3] == ["drop", "drop", "form"] and kinds.count("restored") == 2 and "split" in kinds
    assert all(n > 0 for n in cluster.router.in_flight_at_drop)  # requests in flight on both at the drop
    group = cluster.reconfig.pipeline_report()[0]
    assert group["steps"] > 0 and group["ended_s"] is not None
    # real bytes: the exchange and the split copied KV; half the layers were freed and copied back
    factory = engine.factory
    (executor,) = factory.group_executors
    assert executor.exchanged_bytes > 0 and executor.split_bytes > 0
    assert executor.num_gpu_blocks == 2 * engine.num_gpu_blocks  # a half-model stage's budget holds twice the tokens
    per_layer = sum(p.numel() * p.element_size() for p in loaded.model.layers[0].parameters())
    assert factory.dropped_bytes == factory.restored_bytes == 2 * (NUM_LAYERS // 2) * per_layer
    for iid in (0, 1):
        model = factory.models[iid]
        assert model is not loaded.model and not any(isinstance(m, _Dropped) for m in model.layers)
        assert cluster.drivers[iid].spec.layers is None
        assert cluster.drivers[iid].runtime.blocks.num_used_gpu_blocks == 0


def test_a_stage_model_holds_only_its_layers(loaded):
    from servelab.engine.layer_range import held_layers, stage_model

    stage = stage_model(loaded.model, (2, NUM_LAYERS))
    assert held_layers(stage) == [2, 3] and held_layers(loaded.model) == [0, 1, 2, 3]
    assert stage.layers[2].mlp.down_proj.weight.data_ptr() != loaded.model.layers[2].mlp.down_proj.weight.data_ptr()
