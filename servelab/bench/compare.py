"""``servelab serve-vs-sim``: one workload through ``servelab bench`` against ``servelab serve``
(measured) and through the simulator with the engine's calibrated cost model (predicted).

For each request rate: a fresh ``servelab serve`` process (so client and server do not share
a GIL) with a request log, the benchmark from this process, then the simulator on the same
requests (the same arrival times, the server's prompt token counts, the same output lengths)
under the same policy, instance count and batch limits. Where the time to the first token
goes is split with timestamps on one clock (``time.perf_counter`` is the machine's monotonic
clock, shared by both processes): client to server (HTTP and parsing), server to engine
(tokenising and waiting for the scheduler loop, which reads its inbox between steps), the
engine's own TTFT, and engine to client (the event-loop hop, SSE and the client's parsing).
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servelab.core.errors import UserError


BENCH_KEYS = ("duration", "request_throughput", "output_throughput", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
              "median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms", "median_e2el_ms")


@dataclass(frozen=True)
class CompareOptions:
    model: Path
    cost_model: Path
    workload: str
    rates: tuple[float, ...]
    policy: str = "vllm"
    num_instances: int = 1
    threads: int = 1
    kv_budget_mb: float = 256.0
    block_size: int = 16
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    burstiness: float = 1.0
    seed: int = 0
    data_dir: Path | None = None
    progress: bool = True
    startup_timeout_s: float = 300.0

    def serve_args(self, port: int, log: Path) -> list[str]:
        return [sys.executable, "-m", "servelab.cli.main", "serve", "--model", str(self.model), "--policy",
                self.policy, "--instances", str(self.num_instances), "--port", str(port), "--threads",
                str(self.threads), "--kv-budget-mb", f"{self.kv_budget_mb:g}", "--block-size", str(self.block_size),
                "--max-num-batched-tokens", str(self.max_num_batched_tokens), "--max-num-seqs",
                str(self.max_num_seqs), "--request-log", str(log), "--log-level", "warning",
                "--served-model-name", "model"]


def _pct(values, q: float) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.percentile(values, q)) if values else None


def start_server(options: CompareOptions, log: Path) -> tuple[subprocess.Popen, str]:
    import httpx

    from servelab.server.run import free_port

    port = free_port()
    proc = subprocess.Popen(options.serve_args(port, log), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + options.startup_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise UserError(f"servelab serve exited with {proc.returncode}: "
                            f"{proc.stderr.read().decode(errors='replace')[-500:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop_server(proc)
    raise UserError(f"servelab serve did not answer /health within {options.startup_timeout_s:g} s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)  # graceful: uvicorn drains, then the engine thread stops
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def simulate_same(options: CompareOptions, planned, prompt_lens: list[int]) -> tuple[list, int]:
    """The simulator on the benchmark's requests (same times, prompt and output lengths):
    its requests in id order, and how many preemptions it made."""
    from servelab.cluster.presets import cluster_for
    from servelab.core.request import RequestSpec
    from servelab.costmodel.linear import LinearCostModel
    from servelab.simulator import simulate

    specs = [RequestSpec(p.index, p.arrival_s, n, p.output_len) for p, n in zip(planned, prompt_lens)]
    cluster = cluster_for(options.policy, num_instances=options.num_instances, block_size=options.block_size,
                          max_batch_tokens=options.max_num_batched_tokens, max_num_seqs=options.max_num_seqs)
    result = simulate(specs, cluster, cost_model=LinearCostModel.load(options.cost_model))
    preemptions = sum(result.collector.num_preemptions(kind) for kind in ("recompute", "swap"))
    return sorted(result.requests, key=lambda r: r.request_id), preemptions


def _request_times(req) -> tuple[float | None, float | None]:
    t = req.token_times_s
    if not t:
        return None, None
    return t[0] - req.arrival_time_s, ((t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None)


def one_rate(options: CompareOptions, rate: float, out: Path) -> dict:
    from servelab.bench.results import per_request_rows, summarize
    from servelab.bench.run import BenchConfig, run_benchmark, write_results
    from servelab.bench.session import BenchOptions, plan

    bench_options = BenchOptions(base_url="http://unused", workload=options.workload, tokenizer=options.model,
                                 request_rate=rate, burstiness=options.burstiness, seed=options.seed,
                                 data_dir=options.data_dir, progress=options.progress)
    planned, num_inexact = plan(bench_options)
    log = out / f"server-{rate:g}qps.jsonl"
    log.unlink(missing_ok=True)
    proc, url = start_server(options, log)
    try:
        config = BenchConfig(base_url=url, model="model", progress=options.progress, percentiles=(50.0, 90.0, 99.0))
        before = scrape(url)
        results, duration, t0, _ = run_benchmark(config, planned)
        after = scrape(url)
    finally:
        stop_server(proc)
    summary = summarize(results, duration, {}, [50.0, 90.0, 99.0])
    write_results(out, f"bench-{rate:g}qps.json", summary, per_request_rows(results, planned, t0), results)
    rows = {int(r["id"]): r for r in map(json.loads, log.read_text().splitlines())}
    split = _ttft_split(results, rows)
    prompt_lens = [r.prompt_len for r in results]
    sim_reqs, sim_preemptions = simulate_same(options, planned, prompt_lens)
    sim = [_request_times(r) for r in sim_reqs]
    sim_out = sum(r.num_generated_tokens for r in sim_reqs)
    sim_span = max(r.finish_time_s for r in sim_reqs) - min(r.arrival_time_s for r in sim_reqs)
    ok = [r for r in results if r.success and _rid(r) in rows]
    engine_ttft = [rows[_rid(r)]["engine_ttft_s"] for r in ok]
    engine_tpot = [rows[_rid(r)]["engine_tpot_s"] for r in ok]
    sim_ttft, sim_tpot = [t for t, _ in sim], [p for _, p in sim]
    return {"rate": rate, "num_requests": len(planned), "completed": summary["completed"],
            "failed": summary["failed"], "num_inexact_prompts": num_inexact,
            "bench": {k: summary[k] for k in BENCH_KEYS},
            "engine": {"median_ttft_ms": _ms(_pct(engine_ttft, 50)), "p99_ttft_ms": _ms(_pct(engine_ttft, 99)),
                       "median_tpot_ms": _ms(_pct(engine_tpot, 50))},
            "preemptions": {"measured": after["vllm:num_preemptions_total"], "sim": sim_preemptions},
            "server_cpu_s": after["process_cpu_seconds_total"] - before["process_cpu_seconds_total"],
            "engine_busy_s": after["servelab:engine_busy_seconds"] - before["servelab:engine_busy_seconds"],
            "ttft_split_ms": split,
            "sim": {"median_ttft_ms": _ms(_pct(sim_ttft, 50)), "p90_ttft_ms": _ms(_pct(sim_ttft, 90)),
                    "p99_ttft_ms": _ms(_pct(sim_ttft, 99)), "median_tpot_ms": _ms(_pct(sim_tpot, 50)),
                    "p90_tpot_ms": _ms(_pct(sim_tpot, 90)), "p99_tpot_ms": _ms(_pct(sim_tpot, 99)),
                    "output_throughput": sim_out / sim_span if sim_span > 0 else None,
                    "unfinished": sum(not r.status.is_terminal or r.finish_reason != "length" for r in sim_reqs)}}


def scrape(url: str) -> dict[str, float]:
    """The server's counters this comparison reads: preemptions, CPU seconds, busy seconds."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    names = ("vllm:num_preemptions_total", "process_cpu_seconds_total", "servelab:engine_busy_seconds")
    text = httpx.get(url + "/metrics", timeout=10).text
    out = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in out:
                out[sample.name] += sample.value
    return out


def _rid(result) -> int:
    return int(result.response_id.rsplit("-", 1)[-1]) if result.response_id else -1


def _ms(x: float | None) -> float | None:
    return None if x is None else 1000.0 * x


def _ttft_split(results, rows: dict) -> dict:
    """Medians (and p90) of each part of the client's TTFT, on the shared monotonic clock."""
    parts: dict[str, list[float]] = {"client_to_server": [], "server_to_engine": [], "engine_ttft": [],
                                     "engine_to_client": [], "client_ttft": []}
    for r in results:
        row = rows.get(_rid(r))
        if not r.success or row is None or row.get("first_token_s") is None:
            continue
        first_seen = r.start_s + r.ttft_s
        parts["client_to_server"].append(row["received_s"] - r.start_s)
        parts["server_to_engine"].append(row["arrival_s"] - row["received_s"])
        parts["engine_ttft"].append(row["engine_ttft_s"])
        parts["engine_to_client"].append(first_seen - row["first_token_s"])
        parts["client_ttft"].append(r.ttft_s)
    return {name: {"median": _ms(_pct(v, 50)), "p90": _ms(_pct(v, 90)), "n": len(v)} for name, v in parts.items()}


def run_compare(options: CompareOptions, out: Path) -> dict:
    if not options.rates or not all(0 < r < math.inf for r in options.rates):
        raise UserError(f"--rates must be finite numbers > 0, got {options.rates}")
    if not Path(options.cost_model).is_file():
        raise UserError(f"--cost-model {options.cost_model}: no such file (make one with servelab calibrate)")
    out.mkdir(parents=True, exist_ok=True)
    rows = [one_rate(options, rate, out) for rate in options.rates]
    payload = {"options": {k: (str(v) if isinstance(v, Path) else v) for k, v in options.__dict__.items()},
               "rows": rows}
    (out / "serve_vs_sim.json").write_text(json.dumps(payload, indent=2))
    return payload
