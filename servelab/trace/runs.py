"""Traced runs: the same runs the commands make, with a ``StepRecorder`` attached, and the
trace of a finished run written to a file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servelab.trace.chrome import chrome_trace, write_trace
from servelab.trace.recorder import StepRecorder


def trace_of(recorder: StepRecorder, result: Any, title: str) -> dict:
    """Chrome trace of a finished run: ``result`` is a ClusterResult or an EngineResult."""
    cluster = recorder.cluster
    return chrome_trace(recorder.steps, requests=result.requests, transfers=result.transfers or (),
                        preemptions=cluster.collector.preemptions if cluster is not None else (),
                        reconfig_log=cluster.reconfig.events_log if cluster is not None else (), title=title)


def write_run_trace(path: Path, recorder: StepRecorder, result: Any, title: str) -> Path:
    return write_trace(path, trace_of(recorder, result, title))


def run_engine_traced(engine: Any, specs: list, params: dict) -> tuple[Any, StepRecorder]:
    """``EngineCluster.run`` with a recorder on its instance drivers (``params``: per request id)."""
    cluster, states = engine.build(lambda spec: params[spec.request_id])
    recorder = StepRecorder().attach_cluster(cluster)
    result = cluster.run(specs)
    return engine.result_of(cluster, states, result.wall_s, result.transfers, result.links), recorder
