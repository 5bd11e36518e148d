"""Benchmark summary under ``vllm bench serve``'s result field names, plus goodput.

Fields: ``duration`` (s), ``completed``, ``failed``, ``total_input_tokens``,
``total_output_tokens``, ``request_throughput``, ``request_goodput``, ``output_throughput``,
``total_token_throughput`` (per second), and for each of ttft, tpot, itl, e2el:
``mean_*_ms``, ``median_*_ms``, ``std_*_ms`` and ``p<P>_*_ms`` for each requested percentile.
A request is good (goodput) when every target given (``ttft:MS tpot:MS e2el:MS``, as vLLM's
``--goodput``) holds for it; TPOT is (e2e - TTFT) / (output tokens - 1), ITL every gap between
streamed tokens. Failed requests count in ``failed`` and ``errors``, never in the latencies.
"""

from __future__ import annotations

import numpy as np

from servelab.bench.client import RequestResult
from servelab.core.errors import UserError

GOODPUT_KEYS = ("ttft", "tpot", "e2el")
METRICS = ("ttft", "tpot", "itl", "e2el")


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    """['ttft:500', 'tpot:50'] (or one 'ttft:500,tpot:50') -> {'ttft': 0.5, 'tpot': 0.05} in seconds.

    The SLO rule of the rest of servelab (``workloads.slo``): units may be written
    (``ttft:0.5s``, ``tpot:50ms``), a bare number is milliseconds here, as in vLLM."""
    from servelab.workloads.slo import parse_slo

    text = ",".join(x for raw in items or () for x in raw.replace(",", " ").split())
    if not text:
        return {}
    for item in text.split(","):
        if item.partition(":")[0].strip().lower() not in GOODPUT_KEYS:
            raise UserError(f"--goodput {item!r}: expected KEY:MS with KEY one of {', '.join(GOODPUT_KEYS)}")
    slo = parse_slo(text, "--goodput", default_unit="ms")
    return {key: value for key in GOODPUT_KEYS if (value := getattr(slo, f"{key}_s")) is not None}


def parse_percentiles(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--metric-percentiles: expected comma-separated numbers, got {text!r}") from None
    if not values or not all(0 < p <= 100 for p in values):
        raise UserError(f"--metric-percentiles: each must be in (0, 100], got {text!r}")
    return values


def parse_percentile_metrics(text: str | None) -> tuple[str, ...]:
    """vLLM's ``--percentile-metrics ttft,tpot,itl`` -> the metrics that get ``pNN`` fields
    (None: all four, servelab's default)."""
    if text is None:
        return METRICS
    names = tuple(x.strip().lower() for x in text.split(",") if x.strip())
    bad = [n for n in names if n not in METRICS]
    if bad or not names:
        raise UserError(f"--percentile-metrics: expected a comma-separated subset of {','.join(METRICS)}, "
                        f"got {text!r}")
    return names


def is_good(r: RequestResult, targets: dict[str, float]) -> bool:
    values = {"ttft": r.ttft_s, "tpot": r.tpot_s or 0.0, "e2el": r.latency_s}
    return r.success and all(values[k] <= v for k, v in targets.items())


def summarize(results: list[RequestResult], duration_s: float, targets: dict[str, float],
              percentiles: list[float], percentile_metrics: tuple[str, ...] = METRICS) -> dict:
    ok = [r for r in results if r.success]
    series = {"ttft": [r.ttft_s for r in ok], "tpot": [r.tpot_s for r in ok if r.tpot_s is not None],
              "itl": [x for r in ok for x in r.itl_s], "e2el": [r.latency_s for r in ok]}
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_len for r in ok)
    good = sum(is_good(r, targets) for r in ok)
    out = {"duration": duration_s, "completed": len(ok), "failed": len(results) - len(ok),
           "total_input_tokens": total_in, "total_output_tokens": total_out,
           "request_throughput": len(ok) / duration_s if duration_s > 0 else 0.0,
           "request_goodput": (good / duration_s if duration_s > 0 else 0.0) if targets else None,
           "output_throughput": total_out / duration_s if duration_s > 0 else 0.0,
           "total_token_throughput": (total_in + total_out) / duration_s if duration_s > 0 else 0.0}
    for name in METRICS:
        values = np.asarray(series[name], dtype=np.float64) * 1000.0
        has = values.size > 0
        out[f"mean_{name}_ms"] = float(values.mean()) if has else None
        out[f"median_{name}_ms"] = float(np.median(values)) if has else None
        out[f"std_{name}_ms"] = float(values.std()) if has else None
        for p in percentiles if name in percentile_metrics else ():
            out[f"p{p:g}_{name}_ms"] = float(np.percentile(values, p)) if has else None
    return out


def per_request_rows(results: list[RequestResult], planned, t0_s: float) -> list[dict]:
    """One row per request for the CSV (times in seconds from the benchmark's start)."""
    rows = []
    for r, p in zip(results, planned):
        rows.append({"index": r.index, "response_id": r.response_id, "success": int(r.success),
                     "scheduled_s": p.arrival_s, "sent_s": r.start_s - t0_s if r.start_s else None,
                     "prompt_len": r.prompt_len, "planned_prompt_len": p.prompt_len, "output_len": r.output_len,
                     "planned_output_len": p.output_len, "ttft_s": r.ttft_s if r.success else None,
                     "tpot_s": r.tpot_s if r.success else None, "e2el_s": r.latency_s if r.success else None,
                     "max_itl_s": max(r.itl_s) if r.itl_s else None, "finish_reason": r.finish_reason,
                     "error": r.error})
    return rows
