"""Conformance: every registered cost model keeps the CostModel contract."""

import numpy as np
import pytest

from servelab.core.plan import PaddedBatch, StepShape
from servelab.costmodel import COST_MODELS, CostModel, LinearCostModel, LinkSpec, make_cost_model


def test_every_registered_cost_model_has_a_builder(cost_model_builders):
    assert set(cost_model_builders) == set(COST_MODELS)


def test_satisfies_protocol(cost_model):
    assert isinstance(cost_model, CostModel)


def test_vectorised_decode_equals_scalar_exactly(cost_model):
    sums = np.arange(0, 200_000, 997)
    maxes = np.minimum(sums, 1000 + np.arange(len(sums)) * 331)  # longest context: up to the whole sum
    fast = cost_model.decode_step_times_s(37, sums, maxes)
    slow = [cost_model.step_time_s(StepShape(num_decodes=37, decode_context_sum=int(s), decode_context_max=int(m)))
            for s, m in zip(sums, maxes)]
    assert fast.shape == sums.shape and fast.tolist() == slow


def test_longest_context_never_makes_a_step_faster(cost_model):
    """The iteration bubble: at an equal sum, a batch with one long context costs at least as
    much as an even batch (strictly more for the roofline's small batches)."""
    even = StepShape(num_decodes=4, decode_context_sum=4 * 1000, decode_context_max=1000)
    skewed = StepShape(num_decodes=4, decode_context_sum=4 * 1000, decode_context_max=3997)
    assert cost_model.step_time_s(skewed) >= cost_model.step_time_s(even)


def test_more_work_takes_longer(cost_model):
    t = cost_model.step_time_s
    assert t(StepShape(num_decodes=1, decode_context_sum=100)) < t(StepShape(num_decodes=1, decode_context_sum=5000))
    assert t(StepShape(num_decodes=8, decode_context_sum=8000)) < t(StepShape(num_decodes=64, decode_context_sum=8000))
    assert t(StepShape(prefill_tokens=(512,), prefill_context=(512,))) < t(
        StepShape(prefill_tokens=(2048,), prefill_context=(2048,)))


def test_empty_step_and_swaps(cost_model):
    assert cost_model.step_time_s(StepShape()) == 0.0
    assert cost_model.step_time_s(StepShape(swap_blocks=64)) == cost_model.swap_time_s(64) > 0
    base = StepShape(num_decodes=4, decode_context_sum=4000)
    with_swap = StepShape(num_decodes=4, decode_context_sum=4000, swap_blocks=64)
    assert cost_model.step_time_s(with_swap) == pytest.approx(cost_model.step_time_s(base) + cost_model.swap_time_s(64))


def test_padding_costs_at_least_the_ragged_batch(cost_model):
    ragged = StepShape(prefill_tokens=(300, 512, 100), prefill_context=(300, 512, 100))
    padded = StepShape(prefill_tokens=(300, 512, 100), prefill_context=(300, 512, 100),
                       padding=PaddedBatch(num_rows=4, row_tokens=512, context_tokens=512))
    assert cost_model.step_time_s(padded) > cost_model.step_time_s(ragged)
    decode_rows = StepShape(num_decodes=3, decode_context_sum=1500,
                            padding=PaddedBatch(num_rows=8, row_tokens=1, context_tokens=1024))
    if isinstance(cost_model, LinearCostModel):
        # a calibrated CPU engine runs a padded step as one masked dense attention, timed apart
        # from the ragged kernel (costmodel.linear, version 4): every row's GEMMs, dense pairs
        assert cost_model.step_time_s(decode_rows) == pytest.approx(
            cost_model._time(8, 0, 0, 8, 0, 8 * 1024))
    else:
        assert cost_model.step_time_s(decode_rows) == pytest.approx(cost_model.step_time_s(
            StepShape(num_decodes=8, decode_context_sum=8 * 1024)))


def test_kv_transfer_scales_with_tokens(cost_model):
    link = LinkSpec(bandwidth_bytes_per_s=25e9, latency_s=20e-6)
    one = cost_model.kv_transfer_time_s(1000, link)
    assert one == pytest.approx(20e-6 + 1000 * 512 * 1024 / 25e9)
    assert cost_model.kv_transfer_time_s(0, link) == 0.0


def test_unknown_cost_model_name_lists_known(instance):
    with pytest.raises(KeyError, match="roofline"):
        make_cost_model("magic", instance)
