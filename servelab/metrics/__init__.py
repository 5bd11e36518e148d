"""Metrics: per-request latencies, run-time collection, run summaries, reports, capacity search.

Collection (``collector``) and per-request math (``request_metrics``) are separate from
summarising (``summary``) and rendering (``report``); only ``report`` touches rich or
matplotlib, and only inside its functions.
"""

from servelab.metrics.capacity import CapacityProbe, CapacityResult, capacity_search
from servelab.metrics.collector import MetricsCollector, StepColumns
from servelab.metrics.request_metrics import RequestTable
from servelab.metrics.summary import ConservationError, InstanceSummary, LatencyStats, RunSummary, summarize

__all__ = ["CapacityProbe", "CapacityResult", "ConservationError", "InstanceSummary", "LatencyStats",
           "MetricsCollector", "RequestTable", "RunSummary", "StepColumns", "capacity_search", "summarize"]
