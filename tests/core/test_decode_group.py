"""The decode group is bookkeeping only: a run with it gives exactly the run without it.

``servelab/core/decode_group.py`` advances steady decoders' counters in O(1) per step; any
difference in a request's token times, preemptions or ending would mean the group changed
what was simulated, not only how fast. Hypothesis draws workloads (including KV small enough
to preempt, block-boundary lengths and hand-offs) and both runs are compared request by request.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import servelab.core.instance as instance_module
from servelab.baselines.vllm import ContinuousBatchingPolicy
from servelab.baselines.sarathi import SarathiPolicy
from servelab.cluster.presets import cluster_for
from servelab.core.request import RequestSpec
from servelab.costmodel.roofline import roofline_for
from servelab.simulator import Simulation

COST = roofline_for("A100-40GB", "Llama-2-13B")
TINY_KV = {"gpu": "A100-40GB", "model": "Llama-2-13B", "memory_reserve_fraction": 0.388}  # 19 blocks of 16


def _run(specs, policy: str, instances: int, group: bool, hardware: dict, min_rows: int = 0) -> list[tuple]:
    cls = SarathiPolicy if policy.startswith("sarathi") else ContinuousBatchingPolicy
    before, before_rows = cls.uses_decode_group, instance_module.MIN_GROUP_ROWS
    cls.uses_decode_group = group
    instance_module.MIN_GROUP_ROWS = min_rows  # 0: every steady decoder joins, the hardest case
    try:
        sim = Simulation(specs, cluster_for(policy, num_instances=instances, **hardware), cost_model=COST)
        if group:
            assert any(d.runtime.group is not None for d in sim.driver.drivers) or policy == "distserve"
        res = sim.run()
    finally:
        cls.uses_decode_group = before
        instance_module.MIN_GROUP_ROWS = before_rows
    return [(r.request_id, r.status.value, r.finish_reason, r.num_preemptions, tuple(r.token_times_s))
            for r in sorted(res.requests, key=lambda r: r.request_id)]


_rows = st.lists(st.tuples(st.floats(0, 2), st.sampled_from([1, 15, 16, 17, 31, 32, 100, 250]),
                           st.integers(1, 300)), min_size=1, max_size=40)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=_rows, policy=st.sampled_from(["vllm", "sjf", "sarathi:token_budget=64", "distserve"]),
       instances=st.sampled_from([1, 2]), tiny=st.booleans(), min_rows=st.sampled_from([0, 0, 4]))
def test_the_group_changes_nothing_that_is_simulated(rows, policy, instances, tiny, min_rows):
    specs = [RequestSpec(i, t, p, o, predicted_output_tokens=o) for i, (t, p, o) in enumerate(sorted(rows))]
    hardware = TINY_KV if tiny else {"gpu": "A100-40GB", "model": "Llama-2-13B"}
    if policy == "distserve":
        instances = 2
    assert _run(specs, policy, instances, True, hardware, min_rows) == _run(specs, policy, instances, False, hardware)


def test_a_long_steady_batch_takes_the_group_path(monkeypatch):
    """Sixty decoders of one length (over MIN_GROUP_ROWS): the decode steps take the group path."""
    specs = [RequestSpec(i, 0.0, 32, 200) for i in range(60)]
    sim = Simulation(specs, cluster_for("vllm", gpu="A100-80GB", model="Llama-2-7B"), cost_model=COST)
    runtime = sim.driver.drivers[0].runtime
    seen = []
    step = type(runtime).apply

    def spy(self, plan, now_s):
        applied = step(self, plan, now_s)
        seen.append(applied.group_rows)
        return applied

    monkeypatch.setattr(type(runtime), "apply", spy)  # the runtime has __slots__: patched on its class
    res = sim.run()
    assert res.num_output_tokens == 60 * 200
    assert max(seen) >= 59  # (nearly) the whole batch decoded as one group, past MIN_GROUP_ROWS
