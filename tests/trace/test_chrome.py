"""The Chrome trace of a simulated cluster run is valid JSON of the expected structure: known
phases, non-negative durations, a track per instance, flows that pair up, async slices that
close, and the step args that say what ran."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from servelab import api
from servelab.trace import StepRecorder, chrome_trace
from servelab.trace.runs import trace_of, write_run_trace

PHASES = {"X", "i", "b", "e", "s", "f", "M"}


def _check(trace: dict) -> Counter:
    events = trace["traceEvents"]
    assert all(e["ph"] in PHASES for e in events)
    assert all(e["dur"] >= 0 for e in events if e["ph"] == "X")
    flows = Counter((e["id"], e["ph"]) for e in events if e["ph"] in ("s", "f"))
    ids = {i for i, _ in flows}
    assert all(flows[(i, "s")] == 1 and flows[(i, "f")] == 1 for i in ids)
    opened = Counter((e["cat"], e["id"]) for e in events if e["ph"] == "b")
    closed = Counter((e["cat"], e["id"]) for e in events if e["ph"] == "e")
    assert opened == closed
    return Counter(e["ph"] for e in events)


def _simulate(policy: str, n: int, tmp_path):
    recorder = StepRecorder()
    workload = api.load_workload("burst:n=12,prompt=uniform(32,256),output=uniform(4,32)", seed=0)
    out = api.run_simulation(workload, policy, api.HardwareChoice(num_instances=n), recorder=recorder)
    path = write_run_trace(tmp_path / "trace.json", recorder, out.result, "test")
    return json.loads(path.read_text()), recorder, out


def test_disaggregated_run_has_a_track_per_instance_and_paired_flows(tmp_path):
    trace, recorder, out = _simulate("distserve", 2, tmp_path)
    phases = _check(trace)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert {"instance 0", "instance 1", "requests"} <= names
    # every finished request went prefill -> decode instance once: one flow and one transfer each
    finished = sum(r.status.value == "finished" for r in out.result.requests)
    assert phases["s"] == finished == len(out.result.transfers)
    steps = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["tid"] for e in steps} == {1, 2}
    prefills = [e for e in steps if e["name"] == "prefill"]
    assert prefills and all(e["args"]["prefill_chunks"] for e in prefills)
    assert sum(len(e["args"]["requests"]) for e in steps) > 0


def test_single_instance_run_has_no_flows_and_counts_every_token(tmp_path):
    trace, recorder, out = _simulate("vllm", 1, tmp_path)
    phases = _check(trace)
    assert phases["s"] == phases["f"] == 0
    steps = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    # prefill tokens in the trace add up to the prompts served
    prefilled = sum(n for e in steps for n, _ in e["args"]["prefill_chunks"])
    assert prefilled == sum(r.num_prompt_tokens for r in out.result.requests if r.status.value == "finished")


def test_a_driver_with_a_listener_is_refused():
    class Driver:
        instance_id, busy_s, listener = 0, 0.0, object()

    with pytest.raises(ValueError, match="already has a step listener"):
        StepRecorder().attach([Driver()])


def test_empty_run_gives_a_valid_trace():
    trace = chrome_trace([], title="empty")
    _check(trace)
    assert json.loads(json.dumps(trace))["traceEvents"][0]["name"] == "process_name"


def test_trace_of_uses_recorder_cluster(tmp_path):
    _, recorder, out = _simulate("vllm", 1, tmp_path)
    assert trace_of(recorder, out.result, "x")["traceEvents"]


def test_pipeline_group_steps_and_reconfiguration_are_traced(tmp_path):
    """KunServe drops layers and forms a pipeline group under memory pressure: the group's
    driver is made at run time and must still be heard; drops/forms appear as instants."""
    recorder = StepRecorder()
    workload = api.load_workload("poisson:rate=30,n=300,prompt=uniform(1000,4000),output=uniform(100,400)", seed=0)
    out = api.run_simulation(workload, "kunserve", api.HardwareChoice(num_instances=2), recorder=recorder)
    trace = trace_of(recorder, out.result, "kunserve")
    _check(trace)
    events = trace["traceEvents"]
    names = Counter(e["name"] for e in events if e.get("cat") == "reconfig")
    assert names["drop"] >= 1 and names["form"] == 1
    form = next(e["ts"] for e in events if e["name"] == "form")
    split = next((e["ts"] for e in events if e["name"] == "split"), float("inf"))
    assert any(form <= e["ts"] < split for e in events if e["ph"] == "X")
