"""Timelines of runs: ``StepRecorder`` listens to instance drivers (simulated or real) and
``chrome_trace`` turns what it heard, plus the run's transfers, preemptions and
reconfiguration log, into Chrome trace JSON that Perfetto (ui.perfetto.dev) opens."""

from servelab.trace.chrome import chrome_trace, write_trace
from servelab.trace.recorder import StepRecord, StepRecorder

__all__ = ["StepRecord", "StepRecorder", "chrome_trace", "write_trace"]
