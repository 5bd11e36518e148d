"""``servelab bench``: replay a workload against any OpenAI-compatible server.

Arrivals: ``--trace-timing`` keeps the workload's own times (a trace's pattern); otherwise
``--request-rate R`` draws gamma gaps with vLLM's ``--burstiness`` (the gamma shape: 1 is
Poisson, smaller is burstier; CV = 1/sqrt(burstiness)), and an infinite rate sends
everything at once, as vLLM does. ``--max-concurrency`` caps requests in flight. The
lengths are the workload's; ``max_tokens`` with ``ignore_eos`` forces each output length.

The client is asyncio + httpx in this process, so it must not share a process with the
server it measures (their event loops and the GIL would interfere): ``servelab serve`` runs
as its own process.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from servelab.bench.client import RequestResult, payload_for, send
from servelab.bench.prompts import PlannedRequest
from servelab.core.errors import UserError


@dataclass(frozen=True)
class BenchConfig:
    base_url: str
    endpoint: str = "/v1/completions"
    model: str | None = None  # None: the first model GET /v1/models lists
    api_key: str | None = None
    ignore_eos: bool = True
    temperature: float = 0.0
    max_concurrency: int | None = None
    # per request, first byte to last: a queue of long prompts can hold a request's first byte for
    # many minutes (128 x 1,024 tokens on one CPU core: > 600 s), and a timed-out request is a
    # failed one, not a slow one; 6 h, as vLLM's client
    timeout_s: float = 6 * 3600.0
    goodput: dict[str, float] = field(default_factory=dict)
    percentiles: tuple[float, ...] = (50.0, 90.0, 99.0)
    progress: bool = True

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise UserError(f"--base-url must start with http:// or https://, got {self.base_url!r}")
        if not self.endpoint.startswith("/"):
            raise UserError(f"--endpoint must start with '/', got {self.endpoint!r}")
        if not self.timeout_s > 0:
            raise UserError(f"--request-timeout must be > 0 seconds, got {self.timeout_s:g}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise UserError(f"--max-concurrency must be >= 1, got {self.max_concurrency}")

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def arrival_times(specs, *, request_rate: float, burstiness: float, trace_timing: bool, seed: int) -> np.ndarray:
    n = len(specs)
    if trace_timing:
        times = np.asarray([s.arrival_time_s for s in specs], dtype=np.float64)
        return times - (times.min() if n else 0.0)
    if not request_rate > 0:
        raise UserError(f"--request-rate must be > 0 (inf sends everything at once), got {request_rate}")
    if math.isinf(request_rate):
        return np.zeros(n)
    if not 0 < burstiness <= 1e4:
        raise UserError(f"--burstiness must be in (0, 10000] (gamma shape; 1 is Poisson), got {burstiness}")
    from servelab.workloads.arrivals import GammaArrivals

    return GammaArrivals(request_rate, 1.0 / math.sqrt(burstiness)).sample(n, np.random.default_rng(seed))


def resolve_model(config: BenchConfig) -> str:
    """The model to name in requests: the given one, else the server's first."""
    import httpx

    if config.model:
        return config.model
    try:
        r = httpx.get(config.base_url.rstrip("/") + "/v1/models", headers=config.headers, timeout=30)
        r.raise_for_status()
        return r.json()["data"][0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
        raise UserError(f"--base-url {config.base_url}: cannot list its models ({type(e).__name__}: {e}); "
                        f"give --model") from None


async def _run(config: BenchConfig, model: str, planned: list[PlannedRequest]
               ) -> tuple[list[RequestResult], float, float]:
    import httpx

    url = config.base_url.rstrip("/") + config.endpoint
    limits = httpx.Limits(max_connections=config.max_concurrency or max(len(planned), 1))
    gate = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else None
    bar = _progress(len(planned), config.progress)
    bodies = [payload_for(p, model, config.endpoint, ignore_eos=config.ignore_eos, temperature=config.temperature)
              for p in planned]

    async with httpx.AsyncClient(timeout=httpx.Timeout(config.timeout_s), limits=limits) as client:
        async def one(p: PlannedRequest, body: dict) -> RequestResult:
            delay = t0 + p.arrival_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if gate is None:
                result = await send(client, url, body, p, config.headers)
            else:
                async with gate:
                    result = await send(client, url, body, p, config.headers)
            if bar is not None:
                bar.update(1)
            return result

        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(p, b) for p, b in zip(planned, bodies)))
        duration = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    return list(results), duration, t0


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="requests", unit="req")


def run_benchmark(config: BenchConfig, planned: list[PlannedRequest]) -> tuple[list[RequestResult], float, float, str]:
    """(results in planned order, duration_s, start perf_counter, model name)."""
    model = resolve_model(config)
    results, duration, t0 = asyncio.run(_run(config, model, planned))
    return results, duration, t0, model


def write_results(out_dir: Path, filename: str, summary: dict, rows: list[dict], results: list[RequestResult]) -> list[Path]:
    """The JSON result, the per-request CSV and the plots; returns the paths written."""
    import csv
    import json

    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / filename
    json_path.write_text(json.dumps(summary, indent=2))
    csv_path = out_dir / (Path(filename).stem + "_requests.csv")
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["index"])
        writer.writeheader()
        writer.writerows(rows)
    from servelab.bench.plots import plot_results

    return [json_path, csv_path] + plot_results(out_dir, Path(filename).stem, rows, results)
