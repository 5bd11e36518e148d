"""The step token limit (``--max-num-batched-tokens``) is a limit (issue 22, item 2).

``simulate -p vllm --max-num-batched-tokens 50`` used to run 100-token prefills in one step.
Now a policy that chunks prefills (sarathi and the designs built on it) cuts them to the
limit; one that runs a prefill whole (vllm and its orderings, static, UELLM, Multi-Bin,
BucketServe) rejects a request whose prompt can never fit one step, with the reason, as
vLLM without chunked prefill does; padded batches keep rows x longest prompt within it.
Property: for every policy, preset and router in the conservation matrix, any limit and
workload, no step computes more tokens than the limit of the instance that runs it (a
pipeline group of k instances has k times the limit: each stage takes one micro-batch),
and every request still ends. (It also found static batching plans past ``max_num_seqs``
when ``batch_size`` was larger: a crash, now capped.)
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability.conservation import NORMAL, systems
from simkit import ToyCostModel

from servelab.core.instance import InstanceRuntime
from servelab.core.request import RequestSpec, RequestStatus
from servelab.simulator import Simulation

SYSTEMS = systems()


@st.composite
def limited_runs(draw):
    max_num_seqs = draw(st.integers(1, 16))
    limit = draw(st.integers(max_num_seqs, 600))
    gaps = st.one_of(st.just(0.0), st.floats(0, 0.05))  # bursts fill batches past the row limit
    rows = draw(st.lists(st.tuples(st.integers(1, 1500), st.integers(1, 40), gaps), min_size=1, max_size=12))
    specs, now = [], 0.0
    for i, (prompt, output, gap) in enumerate(rows):
        now += gap
        specs.append(RequestSpec(i, now, prompt, output, predicted_output_tokens=output))
    return draw(st.sampled_from(SYSTEMS)), limit, max_num_seqs, specs


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])  # monkeypatch.context() per example
@given(run=limited_runs())
def test_no_step_exceeds_the_step_limit(run, monkeypatch):
    system, limit, max_num_seqs, specs = run
    steps: list[tuple[int, int]] = []  # (tokens the step computes, the limit of the instance that ran it)
    apply = InstanceRuntime.apply

    def watched(self, plan, now_s):
        pad = plan.padding
        steps.append((sum(plan.num_tokens) if pad is None else pad.num_rows * pad.row_tokens, self.max_batch_tokens))
        return apply(self, plan, now_s)

    cluster = system.cluster({**NORMAL, "max_batch_tokens": limit, "max_num_seqs": max_num_seqs})
    with monkeypatch.context() as m:
        m.setattr(InstanceRuntime, "apply", watched)
        res = Simulation(specs, cluster, cost_model=ToyCostModel(), fast_forward=False).run()
    assert res.conserved
    for tokens, instance_limit in steps:
        assert instance_limit % limit == 0 and instance_limit // limit <= cluster.num_instances, instance_limit
        assert tokens <= instance_limit, (system.label, tokens, instance_limit)
    for req in res.requests:
        if req.status is RequestStatus.REJECTED and "step limit" in req.finish_reason:
            assert req.num_pending_tokens > limit, req.finish_reason


@pytest.mark.parametrize("policy,expected", [("vllm", "rejected"), ("sarathi", "finished")])
def test_a_prompt_over_the_limit_is_rejected_by_vllm_and_chunked_by_sarathi(policy, expected):
    from servelab import api

    specs = [RequestSpec(0, 0.0, 100, 4), RequestSpec(1, 0.0, 20, 4)]
    out = api.run_simulation(specs, policy, api.HardwareChoice(max_batch_tokens=50, max_num_seqs=8))
    first, second = out.result.requests
    assert first.status.value == expected and second.status is RequestStatus.FINISHED
    if expected == "rejected":
        assert "needs 100 tokens in one step" in first.finish_reason and "50" in first.finish_reason
    steps = out.result.collector.steps
    assert max(steps.num_tokens + steps.num_padding_tokens) <= 50 or policy == "vllm"


@pytest.mark.parametrize("tokens,seqs", [(50, 256), (1, 256), (8, 16)])
def test_a_token_limit_below_the_row_limit_is_refused_as_vllm_does(tokens, seqs):
    from servelab import api
    from servelab.core.errors import UserError

    with pytest.raises(UserError, match=r"--max-num-batched-tokens.*must be >= --max-num-seqs"):
        api.HardwareChoice(max_batch_tokens=tokens, max_num_seqs=seqs)


@pytest.mark.parametrize("policy", ["static", "uellm", "static:batch_size=64"])
def test_a_static_batch_larger_than_the_row_limit_runs_in_row_limit_pieces(policy):
    """static planned batch_size rows on an instance allowing fewer (a PlanError, a traceback)."""
    from servelab import api

    specs = [RequestSpec(i, 0.0, 30, 5) for i in range(20)]
    out = api.run_simulation(specs, policy, api.HardwareChoice(max_batch_tokens=600, max_num_seqs=3))
    assert {r.status for r in out.result.requests} == {RequestStatus.FINISHED}
    assert max(out.result.collector.steps.num_rows) <= 3
