"""Builders for every registered cost model, so conformance tests run over all of them."""

import pytest

from servelab.catalog.instance import InstanceSpec
from servelab.core.plan import StepShape
from servelab.costmodel import fit_linear_cost_model, make_cost_model
from servelab.costmodel.roofline import RooflineCostModel

INSTANCE = InstanceSpec("A100-80GB", "llama-2-7b")


def _roofline_samples(model: RooflineCostModel) -> list[tuple[StepShape, float]]:
    """Steps a calibration run would time: decode batches, prefill chunks, mixes, swaps."""
    shapes = [StepShape(num_decodes=b, decode_context_sum=b * c) for b in (1, 8, 32, 128) for c in (256, 2048)]
    shapes += [StepShape(prefill_tokens=(n,), prefill_context=(n,)) for n in (128, 512, 2048)]
    shapes += [StepShape(prefill_tokens=(256,), prefill_context=(1024,), num_decodes=16, decode_context_sum=16000)]
    shapes += [StepShape(num_decodes=8, decode_context_sum=8000, swap_blocks=s) for s in (16, 256)]
    return [(s, model.step_time_s(s)) for s in shapes]


def _linear(instance, tmp_path):
    fitted, _ = fit_linear_cost_model(_roofline_samples(RooflineCostModel(instance)))
    path = tmp_path / "linear.json"
    fitted.save(path)
    return make_cost_model("linear", instance, path=path)


BUILDERS = {
    "roofline": lambda instance, tmp_path: make_cost_model("roofline", instance),
    "linear": _linear,
    "profile": lambda instance, tmp_path: make_cost_model("profile", instance),
}


@pytest.fixture
def roofline_samples():
    return _roofline_samples


@pytest.fixture
def cost_model_builders():
    return BUILDERS


@pytest.fixture
def instance():
    return INSTANCE


@pytest.fixture(params=sorted(BUILDERS))
def cost_model(request, tmp_path):
    return BUILDERS[request.param](INSTANCE, tmp_path)
