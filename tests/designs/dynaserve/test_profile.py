"""The profile table: profiled from a cost model, inverted into prefill budgets, refined online."""

import numpy as np
import pytest
from simkit import ToyCostModel

from servelab.core.plan import StepShape
from servelab.designs.dynaserve.profile import ProfileTable


def _shape(p, c, n):
    return StepShape(prefill_tokens=(p,) if p else (), prefill_context=(p,) if p else (), num_decodes=n,
                     decode_context_sum=n * c, decode_context_max=c)


@pytest.fixture
def toy():
    return ToyCostModel(step_s=0.005, token_s=1e-4, ctx_s=1e-7)


def test_a_linear_cost_model_is_interpolated_exactly(toy):
    table = ProfileTable.from_cost_model(toy, 4096, 256)
    for p, c, n in [(300, 700, 10), (1000, 3000, 100), (16, 0, 1), (4000, 20000, 250)]:
        assert table.latency_s(p, c, n) == pytest.approx(toy.step_time_s(_shape(p, c, n)), rel=1e-9)
    many = table.latency_many(np.array([300.0, 1000.0]), np.array([700.0, 3000.0]), np.array([10.0, 100.0]))
    assert many == pytest.approx([table.latency_s(300, 700, 10), table.latency_s(1000, 3000, 100)])


def test_the_budget_is_the_largest_prefill_under_the_target(toy):
    table = ProfileTable.from_cost_model(toy, 4096, 256)
    for c, n in [(0, 0), (1000, 32), (2000, 128)]:
        budget = table.prefill_budget(c, n, 0.05)
        # toy: 0.005 + 1e-4 * (p + n) + 1e-7 * (p + n * c) <= 0.05
        exact = (0.05 - 0.005 - 1e-4 * n - 1e-7 * n * c) / (1e-4 + 1e-7)
        assert budget == pytest.approx(exact, abs=2)
        assert table.latency_s(budget, c, n) <= 0.05 + 1e-9
    assert table.prefill_budget(0, 256, 0.01) == 0  # the decodes alone exceed the target


def test_a_refresh_inverts_the_budgets_in_use_so_the_next_plan_does_not(toy):
    """Issue 26: the inversion after a refresh (1 step of 16) was the batch planner's p99; it now
    runs in the refresh, and the budgets are the ones the lookup would have computed."""
    table = ProfileTable.from_cost_model(toy, 4096, 256)
    before = table.prefill_budget(1000, 32, 0.05)
    shape = _shape(512, 1024, 64)
    version = table.version
    for _ in range(16):  # enough measured steps for one refresh
        table.observe(shape, 1.3 * toy.step_time_s(shape))
    assert table.version == version + 1
    assert list(table._budget_cache) == [0.05]  # the target in use, inverted with the new latencies
    cached = table._budget_cache[0.05]
    table._budget_cache.clear()
    assert table._budget_grid(0.05) == cached  # what a lookup would compute
    assert table.prefill_budget(1000, 32, 0.05) == before  # this cell's budget: its latencies did not move


def test_measured_steps_pull_the_table_toward_them(toy):
    table = ProfileTable.from_cost_model(toy, 4096, 256)
    shape = _shape(512, 1024, 64)
    before = table.latency_s(512, 1024, 64)
    for _ in range(64):  # the machine is 30% slower than profiled around this cell
        table.observe(shape, 1.3 * toy.step_time_s(shape))
    after = table.latency_s(512, 1024, 64)
    assert before < after <= 1.3 * before * 1.01
    assert table.latency_s(16, 0, 1) == pytest.approx(toy.step_time_s(_shape(16, 0, 1)))  # far cells untouched


def test_an_unprofiled_table_is_filled_from_measured_steps(toy):
    table = ProfileTable.unprofiled(4096, 256)
    assert not table.ready
    rng = np.random.default_rng(0)
    for _ in range(40):
        p, n, c = int(rng.integers(0, 2000)), int(rng.integers(0, 200)), int(rng.integers(100, 4000))
        shape = _shape(p, c, n)
        if shape.num_tokens:
            table.observe(shape, toy.step_time_s(shape))
    assert table.ready
    assert table.latency_s(1000, 2000, 50) == pytest.approx(toy.step_time_s(_shape(1000, 2000, 50)), rel=0.05)


def test_a_prefill_late_in_a_long_prompt_costs_more_than_the_table_says():
    from servelab.catalog.instance import InstanceSpec
    from servelab.simulator.hardware import model_for_spec

    cost = model_for_spec(InstanceSpec("A100-80GB", "Qwen-2.5-14B"), None).cost
    table = ProfileTable.from_cost_model(cost, 8192, 256)
    assert table.context_weight > 0
    late = cost.step_time_s(StepShape(prefill_tokens=(512,), prefill_context=(8192,)))
    per_token = (table.latency_s(2048, 0, 0) - table.latency_s(256, 0, 0)) / 1792
    predicted = table.latency_s(512, 0, 0) + table.context_weight * per_token * 512 * (8192 - 512)
    assert predicted == pytest.approx(late, rel=0.05)
