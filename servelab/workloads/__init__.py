"""Workloads: traces, datasets, synthetic arrivals and lengths, composed into request lists.

A workload is a ``list[RequestSpec]`` sorted by arrival time with ids 0..n-1 and the first
arrival at 0. Arrival processes (``arrivals``) and length sources (``lengths``) are
independent and combined by ``workload.build_workload``; ``spec.parse_workload`` turns a
CLI string into a workload. Nothing here imports torch; ``tokenizers`` is imported only
when text must be tokenised (GSM8K).
"""

from servelab.workloads._parse import WorkloadError
from servelab.workloads.arrivals import BurstArrivals, GammaArrivals, PoissonArrivals, TraceArrivals
from servelab.workloads.datasets import load_arxiv_lengths, load_gsm8k
from servelab.workloads.lengths import (EmpiricalLengths, Exponential, Fixed, IndependentLengths, LengthTable,
                                        LogNormal, MixtureLengths, Uniform, alpaca_like, longbench_like)
from servelab.workloads.spec import parse_spec, parse_workload
from servelab.workloads.traces import load_azure_llm, load_burstgpt, load_mooncake
from servelab.workloads.workload import (RequestAttrs, Workload, WorkloadStats, arrival_times, assign_attrs,
                                         build_workload, compose, describe, head, length_table, mean_rate_per_s,
                                         scale_rate, scale_to_rate, time_window)

__all__ = [
    "WorkloadError", "BurstArrivals", "GammaArrivals", "PoissonArrivals", "TraceArrivals",
    "load_arxiv_lengths", "load_gsm8k", "EmpiricalLengths", "Exponential", "Fixed", "IndependentLengths",
    "LengthTable", "LogNormal", "MixtureLengths", "Uniform", "alpaca_like", "longbench_like",
    "parse_spec", "parse_workload", "load_azure_llm", "load_burstgpt", "load_mooncake",
    "RequestAttrs", "Workload", "WorkloadStats", "arrival_times", "assign_attrs", "build_workload", "compose",
    "describe", "head", "length_table", "mean_rate_per_s", "scale_rate", "scale_to_rate", "time_window",
]
