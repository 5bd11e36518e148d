"""One ``servelab bench`` run from its options: plan, send, summarise, write.

The JSON result holds vLLM's summary fields (see ``results``) plus what was asked
(``workload``, ``request_rate``, ``burstiness``, ``max_concurrency``, ``model_id``,
``base_url``, ``date``), the per-request lists ``input_lens``, ``output_lens``, ``ttfts``,
``itls``, ``errors`` as vLLM writes them, and ``num_inexact_prompts`` (prompts whose token
count could not be matched exactly). ``measured`` names the client machine.
"""

from __future__ import annotations

import math
import platform
import time
from dataclasses import dataclass
from pathlib import Path

from servelab.core.errors import UserError
from servelab.core.limits import MAX_NUM_REQUESTS


@dataclass(frozen=True)
class BenchOptions:
    base_url: str
    workload: str
    endpoint: str = "/v1/completions"
    model: str | None = None
    tokenizer: Path | None = None
    prompt_format: str = "text"
    num_prompts: int | None = None
    request_rate: float = math.inf
    burstiness: float = 1.0
    trace_timing: bool = False
    max_concurrency: int | None = None
    request_timeout_s: float = 6 * 3600.0
    goodput: tuple[str, ...] = ()
    metric_percentiles: str = "50,90,99"
    percentile_metrics: str | None = None  # vLLM's --percentile-metrics: which metrics get pNN fields (None: all)
    ignore_eos: bool = True
    temperature: float = 0.0
    api_key: str | None = None
    seed: int = 0
    data_dir: Path | None = None
    progress: bool = True


def load_specs(options: BenchOptions):
    from servelab import api

    specs = api.load_workload(options.workload, data_dir=options.data_dir or api.DEFAULT_DATA_DIR, seed=options.seed)
    if options.num_prompts is not None:
        if not 1 <= options.num_prompts <= MAX_NUM_REQUESTS:
            raise UserError(f"--num-prompts must be in [1, {MAX_NUM_REQUESTS:,}], got {options.num_prompts}")
        specs = specs[:options.num_prompts]
    if not specs:
        raise UserError(f"--workload {options.workload!r}: no requests")
    return specs


def plan(options: BenchOptions):
    """(planned requests, number of inexact prompts) for the options."""
    from servelab.bench.prompts import load_tokenizer, plan_requests
    from servelab.bench.run import arrival_times

    if options.trace_timing and not math.isinf(options.request_rate):
        raise UserError("give either --trace-timing or --request-rate, not both")
    specs = load_specs(options)
    times = arrival_times(specs, request_rate=options.request_rate, burstiness=options.burstiness,
                          trace_timing=options.trace_timing, seed=options.seed)
    tokenizer = load_tokenizer(options.tokenizer) if options.tokenizer is not None else None
    corpus = None
    if tokenizer is not None:
        from servelab.bench.prompts import corpus_texts

        corpus = corpus_texts(options.data_dir)
    return plan_requests(specs, times, tokenizer=tokenizer, prompt_format=options.prompt_format,
                         corpus_texts=corpus)


def bench_session(options: BenchOptions, result_dir: Path, result_filename: str | None = None
                  ) -> tuple[dict, list[Path]]:
    from servelab.bench.results import parse_goodput, parse_percentiles, per_request_rows, summarize
    from servelab.bench.run import BenchConfig, run_benchmark, write_results

    from servelab.bench.results import parse_percentile_metrics

    targets = parse_goodput(list(options.goodput))
    percentiles = parse_percentiles(options.metric_percentiles)
    selected = parse_percentile_metrics(options.percentile_metrics)
    config = BenchConfig(base_url=options.base_url, endpoint=options.endpoint, model=options.model,
                         api_key=options.api_key, ignore_eos=options.ignore_eos, temperature=options.temperature,
                         max_concurrency=options.max_concurrency, timeout_s=options.request_timeout_s, goodput=targets, percentiles=tuple(percentiles),
                         progress=options.progress)
    planned, num_inexact = plan(options)
    results, duration, t0, model = run_benchmark(config, planned)
    summary = {"date": time.strftime("%Y%m%d-%H%M%S"), "base_url": options.base_url, "endpoint": options.endpoint,
               "model_id": model, "workload": options.workload, "num_prompts": len(planned),
               "request_rate": "inf" if math.isinf(options.request_rate) else options.request_rate,
               "burstiness": options.burstiness, "trace_timing": options.trace_timing,
               "max_concurrency": options.max_concurrency, "goodput_targets_ms": {k: v * 1000 for k, v in targets.items()},
               "measured": f"client on {platform.node()} ({platform.machine()}, {platform.system()})",
               "num_inexact_prompts": num_inexact}
    summary.update(summarize(results, duration, targets, percentiles, selected))
    summary.update({"input_lens": [r.prompt_len for r in results], "output_lens": [r.output_len for r in results],
                    "ttfts": [r.ttft_s for r in results], "itls": [r.itl_s for r in results],
                    "errors": [r.error for r in results]})
    rows = per_request_rows(results, planned, t0)
    name = result_filename or default_filename(options, model, summary["date"])
    if result_filename is None:
        name = unique_path(result_dir, name)
    paths = write_results(result_dir, name, summary, rows, results)
    return summary, paths


def default_filename(options: BenchOptions, model: str, date: str) -> str:
    """``bench-<rate>qps[-concurrency<N>]-<model>-<YYYYmmdd-HHMMSS>.json``: vLLM's pattern
    (backend, rate, model, date and time), so a rerun never replaces an earlier result."""
    rate = "inf" if math.isinf(options.request_rate) else f"{options.request_rate:g}"
    concurrency = f"-concurrency{options.max_concurrency}" if options.max_concurrency else ""
    base = model.rstrip("/").rsplit("/", 1)[-1] or "model"
    safe = "".join(ch if ch.isalnum() or ch in "-._" else "_" for ch in base)
    return f"bench-{rate}qps{concurrency}-{safe}-{date}.json"


def unique_path(folder: Path, name: str) -> str:
    """``name``, or ``name`` with ``-2``, ``-3``, ... before the suffix when it is taken (two
    runs in one second)."""
    stem, suffix = Path(name).stem, Path(name).suffix
    k, candidate = 1, name
    while (folder / candidate).exists():
        k += 1
        candidate = f"{stem}-{k}{suffix}"
    return candidate


def format_summary(s: dict) -> str:
    """The summary as ``vllm bench serve`` prints it."""
    lines = ["{s:{c}^50}".format(s=" Serving Benchmark Result ", c="=")]

    def row(label: str, value, fmt: str = "{:<10.2f}") -> None:
        lines.append(f"{label:<40}" + (fmt.format(value) if value is not None else "n/a"))

    row("Successful requests:", s["completed"], "{:<10}")
    row("Failed requests:", s["failed"], "{:<10}")
    row("Benchmark duration (s):", s["duration"])
    row("Total input tokens:", s["total_input_tokens"], "{:<10}")
    row("Total generated tokens:", s["total_output_tokens"], "{:<10}")
    row("Request throughput (req/s):", s["request_throughput"])
    if s.get("request_goodput") is not None:
        row("Request goodput (req/s):", s["request_goodput"])
    row("Output token throughput (tok/s):", s["output_throughput"])
    row("Total Token throughput (tok/s):", s["total_token_throughput"])
    for name, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                        ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
        lines.append("{s:{c}^50}".format(s=f" {title} ", c="-"))
        row(f"Mean {name.upper()} (ms):", s[f"mean_{name}_ms"])
        row(f"Median {name.upper()} (ms):", s[f"median_{name}_ms"])
        for key in [k for k in s if k.startswith("p") and k.endswith(f"_{name}_ms")]:
            row(f"P{key[1:].split('_')[0]} {name.upper()} (ms):", s[key])
    lines.append("=" * 50)
    return "\n".join(lines)
