"""The global scheduler in the simulator: every kind of split happens and every request ends;
fixed splits land where asked; short requests are never handed off mid-decode; the preset."""

import numpy as np
import pytest

from servelab.cluster.config import ClusterConfig, InstanceGroup
from servelab.cluster.presets import cluster_for
from servelab.core.registry import RegistryError
from servelab.core.request import RequestSpec, RequestStatus
from servelab.simulator import Simulation

MODEL = dict(gpu="A100-80GB", model="Qwen-2.5-14B")


def _cluster(**router):
    return ClusterConfig(groups=(InstanceGroup(count=2, policy="dynaserve", **MODEL),), router="dynaserve",
                         router_params=router)


def _specs(n=120, seed=0):
    rng = np.random.default_rng(seed)
    prompts = rng.choice([100, 300, 2000, 6000], n)
    outputs = rng.choice([5, 30, 300, 1200], n)
    times = np.cumsum(rng.exponential(0.25, n))
    return [RequestSpec(i, float(times[i]), int(prompts[i]), int(outputs[i]), predicted_output_tokens=int(outputs[i]))
            for i in range(n)]


def _run(specs, **router):
    sim = Simulation(specs, _cluster(**router))
    res = sim.run()
    assert res.conserved and all(r.status is RequestStatus.FINISHED for r in res.requests), \
        {r.finish_reason for r in res.requests}
    for inst in sim.instances:
        inst.runtime.check_invariants()
        assert inst.runtime.blocks.num_free_gpu_blocks == inst.runtime.blocks.num_gpu_blocks
    return sim, res


def test_dynamic_splits_of_every_kind_and_every_request_ends():
    sim, res = _run(_specs())
    d = np.array(sim.router.decisions)
    prompt, total, split = d[:, 1], d[:, 2], d[:, 3]
    assert np.any((split > 0) & (split < prompt)), "no split inside a prompt"
    assert np.any((split > prompt) & (split < total)), "no split inside a decode"
    assert np.any(split >= total) or np.any(split == 0), "nothing placed whole"
    handed = [r for r in res.requests if r.num_transfers]
    assert handed and len(res.transfers) == len(handed)
    assert all(r.num_transfers == 1 for r in handed)
    gaps = [b - a for r in res.requests for a, b in zip(r.token_times_s, r.token_times_s[1:])]
    assert np.percentile(gaps, 99) <= 0.1


def test_short_requests_are_not_handed_off_after_their_first_token():
    sim, _ = _run(_specs())
    for rid, prompt, total, split in sim.router.decisions:
        if total - prompt <= 100 + 2 * 20:
            assert not prompt <= split < total, (rid, prompt, total, split)


@pytest.mark.parametrize("fraction", [-0.5, 0.0, 0.5])
def test_fixed_splits_land_where_asked(fraction):
    specs = [RequestSpec(i, 0.5 * i, 1024, 1024) for i in range(6)]
    sim, res = _run(specs, split="fixed", decode_fraction=fraction, pairing="fixed")
    want = 1024 + int(round(fraction * 1024))
    assert {s for *_, s in sim.router.decisions} == {want}
    assert all(r.num_transfers == 1 for r in res.requests)
    # the first part ran on instance 0 (the hand-off happened there), the rest on instance 1
    assert all(r.instance_id == 1 for r in res.requests)


def test_bulk_and_streamed_transfers_both_finish_and_streaming_hides_the_copy():
    specs = [RequestSpec(i, 0.3 * i, 3000, 40) for i in range(10)]
    out = {}
    for stream in (0, 128):
        sim, res = _run(specs, split="fixed", decode_fraction=-0.5, pairing="fixed", stream_kv_tokens=stream)
        handoffs = {}
        for rep in res.policy_reports.values():
            handoffs.update(rep["handoff_times_s"])
        out[stream] = np.mean([sim.router.landed_s[i] - handoffs[i] for i in handoffs])
    assert out[128] < 0.5 * out[0]


def test_one_instance_places_everything_there():
    specs = _specs(20)
    sim = Simulation(specs, cluster_for("dynaserve", num_instances=1, **MODEL))
    res = sim.run()
    assert all(r.status is RequestStatus.FINISHED and r.num_transfers == 0 for r in res.requests)


def test_the_preset_splits_parameters_and_rejects_unknown_ones():
    cfg = cluster_for("dynaserve:headroom=0.2,margin_tokens=10,max_probes=4", num_instances=2, **MODEL)
    assert cfg.router == "dynaserve" and cfg.router_params == {"headroom": "0.2", "margin_tokens": "10",
                                                               "max_probes": "4"}
    assert cfg.groups[0].policy_params == {"headroom": "0.2"}
    with pytest.raises(RegistryError, match="no parameter 'bogus'"):
        cluster_for("dynaserve:bogus=1", num_instances=2, **MODEL)
    with pytest.raises(RegistryError):
        Simulation(_specs(5), cluster_for("dynaserve:max_probes=0", num_instances=2, **MODEL))


def test_split_statistics_reach_every_runs_summary():
    """policy_reports["router"] (summary.json) carries where requests were split, the mean split
    point, streamed vs bulk hand-offs and the decision times; it was empty before."""
    from servelab.api import HardwareChoice, run_simulation

    specs = _specs(80)
    reports = {}
    for stream_decode in (False, True):
        out = run_simulation(specs, f"dynaserve:stream_decode_splits={str(stream_decode).lower()}",
                             HardwareChoice(num_instances=2, **MODEL))
        rep = reports[stream_decode] = out.to_dict()["policy_reports"]["router"]
        share = rep["split_share"]
        assert rep["num_requests"] == 80 and sum(share.values()) == pytest.approx(1.0)
        split = round(80 * (1 - share["none"]))
        assert rep["kv_streamed"] + rep["kv_bulk"] == split > 0
        assert 0 < rep["mean_split_fraction"] < 1 and rep["mean_split_tokens"] > 0
        assert rep["decision_time_us"]["count"] == 80 and 0 < rep["decision_time_us"]["p50"]
    # decode-phase splits are copied in bulk by default and streamed with stream_decode_splits
    assert reports[False]["split_share"]["in_decode"] > 0 and reports[False]["kv_bulk"] > 0
    assert reports[True]["kv_bulk"] == 0


def test_paper_pairing_puts_every_alpha_part_on_the_first_instance():
    sim, res = _run(_specs(60), pairing="fixed", stream_decode_splits=True)
    router = sim.driver.router
    assert router.num_bulk == 0
    for req in res.requests:
        if req.handoff_at_tokens is not None:
            assert req.instance_id == 1  # ended on beta, the second instance
