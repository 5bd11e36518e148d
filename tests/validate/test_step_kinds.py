"""docs/fidelity.md item 7: step errors split by step kind for the systems over the goal."""

from __future__ import annotations

from types import SimpleNamespace

from servelab.core.plan import PaddedBatch, StepShape
from servelab.validate.fidelity_doc import System
from servelab.validate.step_kinds import kinds_text, step_kind

DEC1 = StepShape(num_decodes=1, decode_context_sum=100, decode_context_max=100)
PAD_DEC = StepShape(num_decodes=2, decode_context_sum=200, decode_context_max=100, padding=PaddedBatch(4, 1, 100))
PAD_PRE = StepShape(prefill_tokens=(30, 20), prefill_context=(30, 20), padding=PaddedBatch(2, 30, 30))


def test_each_step_has_one_kind():
    assert step_kind(DEC1) == "decode, 1 row" and step_kind(PAD_DEC) == "padded decode"
    assert step_kind(PAD_PRE) == "padded prefill"
    assert step_kind(StepShape(prefill_tokens=(8,), prefill_context=(8,))) == "prefill"
    assert step_kind(StepShape(prefill_tokens=(8, 9), prefill_context=(8, 9))) == "prefills (2+)"
    assert step_kind(StepShape(prefill_tokens=(8,), prefill_context=(8,), num_decodes=1, decode_context_sum=5,
                               decode_context_max=5)) == "mixed"
    assert step_kind(StepShape(num_decodes=3, decode_context_sum=9, decode_context_max=3)) == "decode, 2+ rows"


def _run(label_policy, steps, predicted, step_median):
    cost = SimpleNamespace(step_time_s=lambda shape: predicted[shape])
    recs = [SimpleNamespace(shape=s, duration_s=t) for s, t in steps]
    return (System(label_policy), SimpleNamespace(name="w"),
            SimpleNamespace(real=SimpleNamespace(steps=recs), cost=cost, metrics={"step": {"median": step_median}}))


def test_the_table_names_the_systems_over_the_goal_and_each_kind_error():
    predicted = {DEC1: 0.011, PAD_DEC: 0.008, PAD_PRE: 0.030}
    multibin = _run("multibin", [(DEC1, 0.010)] * 3 + [(PAD_DEC, 0.010), (PAD_PRE, 0.030)], predicted, 0.14)
    sjf = _run("sjf", [(DEC1, 0.010)], predicted, 0.05)
    vllm = _run("vllm", [(DEC1, 0.010)] * 2, predicted, 0.05)
    text = "\n".join(kinds_text([multibin, sjf, vllm], 0.10))
    assert "| multibin x1 | decode, 1 row | 3 | 60.0% | 10.0% | 10.0% |" in text
    assert "| multibin x1 | padded decode | 1 | 20.0% | -20.0% | 20.0% |" in text
    assert "| multibin x1 | padded prefill | 1 | 20.0% | 0.0% | 0.0% |" in text
    assert "| vllm x1 | decode, 1 row | 2 | 100.0% |" in text and "sjf x1" not in text
