"""Chrome trace JSON (the format Perfetto and chrome://tracing open) of one run.

Layout: one process per run; in it a thread (track) per instance with its steps as
complete events (``X``: prefill chunks, decodes, padding and the batch's request ids in
``args``), swaps and preemptions as instant events (``i``) on that track; KV transfers as
async slices (``b``/``e``, they overlap) named by their link; reconfiguration (drops,
restores, failures, pipeline forms/splits) as instant events; each request's life as an
async slice on the "requests" track; and a flow (``s``/``f``, one id per hop) wherever a
request's next step runs on another instance. Times are microseconds from the run's start.

Invariants the tests check: every flow id has exactly one ``s`` and one ``f``; every async
``b`` has its ``e``; ``X`` durations are >= 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from servelab.trace.recorder import StepRecord

PID = 1
REQUESTS_TID = 0
RECONFIG_TID = 10_000


def _us(t_s: float) -> float:
    return round(t_s * 1e6, 3)


def _step_event(rec: StepRecord) -> dict:
    s = rec.shape
    pad = s.padding
    num_padding = max(pad.num_rows * pad.row_tokens - s.num_tokens, 0) if pad is not None else 0
    args = {"prefill_chunks": [[n, c] for n, c in zip(s.prefill_tokens, s.prefill_context)],
            "num_decodes": s.num_decodes, "decode_context_sum": s.decode_context_sum,
            "num_padding_tokens": num_padding, "num_tokens": s.num_tokens, "requests": list(rec.request_ids)}
    if s.swap_blocks:
        args["swap_blocks"] = s.swap_blocks
    if rec.finished_ids:
        args["finished"] = list(rec.finished_ids)
    if rec.handed_off_ids:
        args["handed_off"] = list(rec.handed_off_ids)
    return {"name": rec.kind, "cat": "step", "ph": "X", "pid": PID, "tid": rec.instance_id + 1,
            "ts": _us(rec.start_s), "dur": _us(rec.duration_s), "args": args}


def _instant(name: str, cat: str, t_s: float, tid: int, args: dict | None = None) -> dict:
    return {"name": name, "cat": cat, "ph": "i", "s": "t", "pid": PID, "tid": tid, "ts": _us(t_s),
            "args": args or {}}


def _meta(tid: int, name: str, sort_index: int) -> list[dict]:
    return [{"name": "thread_name", "ph": "M", "pid": PID, "tid": tid, "args": {"name": name}},
            {"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": tid, "args": {"sort_index": sort_index}}]


def _flows(steps: Sequence[StepRecord]) -> list[dict]:
    """A flow from a request's last step on one instance to its next step on another."""
    last: dict[int, StepRecord] = {}
    events, flow_id = [], 0
    for rec in sorted(steps, key=lambda r: (r.start_s, r.instance_id)):
        for rid in rec.request_ids:
            prev = last.get(rid)
            if prev is not None and prev.instance_id != rec.instance_id:
                flow_id += 1
                name = f"request {rid}: instance {prev.instance_id} -> {rec.instance_id}"
                events.append({"name": name, "cat": "flow", "ph": "s", "id": flow_id, "pid": PID,
                               "tid": prev.instance_id + 1, "ts": _us(prev.start_s)})
                events.append({"name": name, "cat": "flow", "ph": "f", "bp": "e", "id": flow_id, "pid": PID,
                               "tid": rec.instance_id + 1, "ts": _us(rec.start_s)})
            last[rid] = rec
    return events


def _request_slices(requests: Iterable[Any]) -> list[dict]:
    events = []
    for req in requests:
        end = req.finish_time_s if req.finish_time_s is not None else req.arrival_time_s
        common = {"name": f"request {req.request_id}", "cat": "request", "pid": PID, "tid": REQUESTS_TID,
                  "id": f"r{req.request_id}"}
        events.append({**common, "ph": "b", "ts": _us(req.arrival_time_s),
                       "args": {"prompt_tokens": req.num_prompt_tokens, "status": req.status.value,
                                "finish_reason": req.finish_reason, "output_tokens": req.num_generated_tokens}})
        events.append({**common, "ph": "e", "ts": _us(max(end, req.arrival_time_s))})
    return events


def _transfers(transfers: Iterable[tuple]) -> list[dict]:
    events = []
    for k, (src, dst, start, duration, num_bytes) in enumerate(transfers):
        name = f"KV {src} -> {dst}"
        common = {"name": name, "cat": "transfer", "pid": PID, "tid": RECONFIG_TID, "id": f"t{k}"}
        events.append({**common, "ph": "b", "ts": _us(start), "args": {"bytes": num_bytes}})
        events.append({**common, "ph": "e", "ts": _us(start + max(duration, 0.0))})
    return events


def chrome_trace(steps: Sequence[StepRecord], *, requests: Iterable[Any] = (), transfers: Iterable[tuple] = (),
                 preemptions: Iterable[tuple[int, float, str]] = (), reconfig_log: Iterable[tuple] = (),
                 title: str = "servelab run", metadata: dict | None = None) -> dict:
    """The trace as a dict (``json.dump`` it, or use ``write_trace``)."""
    requests = list(requests)
    instance_ids = sorted({r.instance_id for r in steps} | {p[0] for p in preemptions})
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": PID, "args": {"name": title}}]
    events += _meta(REQUESTS_TID, "requests", 0)
    for iid in instance_ids:
        events += _meta(iid + 1, f"instance {iid}", iid + 1)
    events += _meta(RECONFIG_TID, "KV transfers and reconfiguration", RECONFIG_TID)
    for rec in steps:
        events.append(_step_event(rec))
        if rec.num_swap_out_blocks:
            events.append(_instant(f"swap out {rec.num_swap_out_blocks} blocks", "swap", rec.start_s,
                                   rec.instance_id + 1))
        if rec.num_swap_in_blocks:
            events.append(_instant(f"swap in {rec.num_swap_in_blocks} blocks", "swap", rec.start_s,
                                   rec.instance_id + 1))
    for iid, t, kind in preemptions:
        events.append(_instant(f"preempt ({kind})", "preemption", t, iid + 1))
    for t, kind, details in reconfig_log:
        iid = details.get("instance")
        tid = iid + 1 if isinstance(iid, int) else RECONFIG_TID
        events.append(_instant(kind, "reconfig", t, tid, {k: v for k, v in details.items()}))
    events += _transfers(transfers)
    events += _request_slices(requests)
    events += _flows(steps)
    return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": dict(metadata or {})}


def write_trace(path: str | Path, trace: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trace, default=str))
    return path


def trace_of_cluster(recorder: Any, cluster: Any, result: Any, **kwargs: Any) -> dict:
    """The trace of a finished ``ClusterDriver`` run (simulator or engine) and its result."""
    return chrome_trace(recorder.steps, requests=result.requests if hasattr(result, "requests") else cluster.requests,
                        transfers=result.transfers or (), preemptions=cluster.collector.preemptions,
                        reconfig_log=cluster.reconfig.events_log, **kwargs)
