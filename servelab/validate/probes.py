"""Probes that time a running server's steps from the outside, through the OpenAI API.

A server's step times are not visible from its API, but two things in a streamed response
are one step each: the time to the first token of a request sent alone is one prefill step
of its prompt (plus the HTTP hop), and a gap between two tokens while ``B`` requests of the
same length decode together is one decode step of ``B`` rows. So:

- **prefill probes**: one request of ``P`` prompt tokens, ``max_tokens`` 4: its TTFT is a
  prefill of ``P`` tokens; its later gaps are decodes of one row at context ``P``;
- **decode probes**: ``B`` requests of ``C`` prompt tokens sent at once, ``ignore_eos`` and a
  fixed ``max_tokens``: the gaps that start after the last request's first token and end
  before the first request's last token are steps of exactly ``B`` decode rows (no prefill
  is left), at context ``C`` + the token's index. ``max_tokens`` covers the prefill steps
  the batch needs (``B x C / max_num_batched_tokens``) plus 10 such gaps.

Each probe gives one sample (the median of its gaps: a loaded machine's outliers do not move
it). Prompts are token ids (random per request, so no prefix cache can hit), which the
OpenAI completions API accepts; a server that counts them differently says so in
``usage.prompt_tokens``, and the sample uses the server's count.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import asdict, dataclass

import numpy as np

from servelab.core.plan import StepShape

PREFILL_LENS = (32, 128, 512, 1024, 2048)
DECODE_BATCHES = (1, 2, 4, 8, 16, 32)
DECODE_CONTEXTS = (128, 512)
PREFILL_MAX_TOKENS = 4
DECODE_CLEAN_GAPS = 10


@dataclass(frozen=True)
class Probe:
    kind: str  # prefill | decode
    prompt_len: int
    batch: int
    max_tokens: int
    repeat: int = 0

    @property
    def label(self) -> str:
        return (f"prefill {self.prompt_len} tok" if self.kind == "prefill"
                else f"decode {self.batch} rows @ ctx {self.prompt_len}") + f" (#{self.repeat + 1})"


def probe_plan(limits: dict, *, prefill_lens=PREFILL_LENS, decode_batches=DECODE_BATCHES,
               decode_contexts=DECODE_CONTEXTS, repeats: int = 2, seed: int = 0) -> list[Probe]:
    """The probes that fit the server's limits, in a seeded shuffled order (a run cut short
    by its time budget keeps a spread of shapes rather than only the small ones)."""
    max_len = limits.get("max_model_len") or 4096
    budget = limits.get("max_num_batched_tokens") or 2048
    seqs = limits.get("max_num_seqs") or 256
    kv_tokens = (limits["num_gpu_blocks"] * limits["block_size"]
                 if limits.get("num_gpu_blocks") and limits.get("block_size") else None)
    probes = []
    for p in sorted({min(p, budget, max_len - PREFILL_MAX_TOKENS - 1) for p in prefill_lens}):
        if p >= 1:
            probes += [Probe("prefill", p, 1, PREFILL_MAX_TOKENS, r) for r in range(repeats)]
    for c in sorted(set(decode_contexts)):
        for b in sorted(set(decode_batches)):
            out = DECODE_CLEAN_GAPS + 1 + math.ceil(b * c / budget)
            if b > seqs or c + out > max_len or (kv_tokens is not None and b * (c + out) > 0.9 * kv_tokens):
                continue
            probes += [Probe("decode", c, b, out, r) for r in range(repeats)]
    order = np.random.default_rng(seed).permutation(len(probes))
    return [probes[i] for i in order]


def format_plan(plan: list[Probe], budget_s: float) -> str:
    pre = [p for p in plan if p.kind == "prefill"]
    dec = [p for p in plan if p.kind == "decode"]
    lines = [f"probe plan: {len(plan)} probes, at most {budget_s:g} s (probes left when time runs out are skipped)",
             f"  prefill: prompts of {sorted({p.prompt_len for p in pre})} tokens, {PREFILL_MAX_TOKENS} output "
             f"tokens, alone; {len(pre)} probes",
             f"  decode: batches of {sorted({p.batch for p in dec})} concurrent streams at contexts "
             f"{sorted({p.prompt_len for p in dec})}, ignore_eos; {len(dec)} probes",
             f"  tokens: {sum(p.batch * p.prompt_len for p in plan):,} prompt, "
             f"{sum(p.batch * p.max_tokens for p in plan):,} output"]
    return "\n".join(lines)


@dataclass
class ProbeRun:
    """One probe's raw client timings: per request, send time and token arrival times."""

    probe: Probe
    requests: list[dict]  # start_s, token_times_s (absolute perf_counter), prompt_len, output_len, error
    samples: list[tuple[StepShape, float]]
    note: str = ""

    def to_json(self) -> dict:
        return {"probe": asdict(self.probe), "requests": self.requests, "note": self.note,
                "samples": [{"shape": _shape_json(s), "seconds": t} for s, t in self.samples]}


def _shape_json(s: StepShape) -> dict:
    return {"prefill_tokens": list(s.prefill_tokens), "prefill_context": list(s.prefill_context),
            "num_decodes": s.num_decodes, "decode_context_sum": s.decode_context_sum,
            "decode_context_max": s.decode_context_max}


def shape_from_json(d: dict) -> StepShape:
    return StepShape(tuple(d["prefill_tokens"]), tuple(d["prefill_context"]), d["num_decodes"],
                     d["decode_context_sum"], d["decode_context_max"])


def token_times(result) -> list[float]:
    """Absolute times of each content chunk of a bench ``RequestResult``."""
    if not result.success:
        return []
    first = result.start_s + result.ttft_s
    return [first] + list(first + np.cumsum(result.itl_s))


def samples_of(probe: Probe, requests: list[dict]) -> tuple[list[tuple[StepShape, float]], str]:
    """The step samples a probe's timings give (and why none, when none)."""
    ok = [r for r in requests if not r["error"] and r["token_times_s"]]
    if len(ok) < len(requests):
        return [], f"{len(requests) - len(ok)} of {len(requests)} requests failed: {requests[0]['error'] or ''}"
    if probe.kind == "prefill":
        r = ok[0]
        p = r["prompt_len"]
        out = [(StepShape((p,), (p,)), r["token_times_s"][0] - r["start_s"])]
        gaps = np.diff(r["token_times_s"])
        if len(gaps):
            ctx = p + 1 + len(gaps) // 2
            out.append((StepShape(num_decodes=1, decode_context_sum=ctx, decode_context_max=ctx),
                        float(np.median(gaps))))
        return out, ""
    start = max(r["token_times_s"][0] for r in ok)
    end = min(r["token_times_s"][-1] for r in ok)
    gaps, indices = [], []
    for r in ok:
        t = np.asarray(r["token_times_s"])
        keep = (t[:-1] >= start) & (t[1:] <= end)
        gaps += list(np.diff(t)[keep])
        indices += list(np.nonzero(keep)[0] + 1)
    if len(gaps) < 3 * len(ok):
        return [], f"only {len(gaps)} gaps with all {len(ok)} requests decoding (a batch limit or chunked stream?)"
    prompt = int(np.median([r["prompt_len"] for r in ok]))
    ctx = prompt + int(np.median(indices))
    b = len(ok)
    return [(StepShape(num_decodes=b, decode_context_sum=b * ctx, decode_context_max=ctx), float(np.median(gaps)))], ""


async def run_probe(client, url: str, model: str, probe: Probe, rng: np.random.Generator, vocab: int,
                    headers: dict | None = None) -> list[dict]:
    """Send the probe's requests at once; their raw timings."""
    from servelab.bench.client import payload_for, send
    from servelab.bench.prompts import PlannedRequest

    planned = [PlannedRequest(i, 0.0, [int(x) for x in rng.integers(10, vocab, size=probe.prompt_len)],
                              probe.prompt_len, probe.max_tokens) for i in range(probe.batch)]
    bodies = [payload_for(p, model, "/v1/completions", ignore_eos=True, temperature=0.0) for p in planned]
    results = await asyncio.gather(*(send(client, url, b, p, headers) for p, b in zip(planned, bodies)))
    return [{"start_s": r.start_s, "token_times_s": token_times(r), "prompt_len": r.prompt_len,
             "output_len": r.output_len, "error": r.error} for r in results]


async def run_plan(base_url: str, model: str, plan: list[Probe], budget_s: float, *, vocab: int = 500,
                   seed: int = 0, headers: dict | None = None, progress=None) -> tuple[list[ProbeRun], list[Probe]]:
    """Run the probes one after another until ``budget_s`` is spent (a probe in flight when it
    runs out is cancelled); returns (the runs, the probes skipped). One warm-up request first."""
    import httpx

    url = base_url.rstrip("/") + "/v1/completions"
    rng = np.random.default_rng(seed)
    runs: list[ProbeRun] = []
    deadline = time.perf_counter() + budget_s
    limits = httpx.Limits(max_connections=max([p.batch for p in plan] + [1]))
    async with httpx.AsyncClient(timeout=httpx.Timeout(max(budget_s, 1.0)), limits=limits) as client:
        warm = Probe("prefill", 16, 1, 2)
        try:
            await asyncio.wait_for(run_probe(client, url, model, warm, rng, vocab, headers), max(budget_s, 1.0))
        except asyncio.TimeoutError:
            return runs, list(plan)
        for k, probe in enumerate(plan):
            left = deadline - time.perf_counter()
            if left <= 0:
                return runs, plan[k:]
            try:
                requests = await asyncio.wait_for(run_probe(client, url, model, probe, rng, vocab, headers), left)
            except asyncio.TimeoutError:
                return runs, plan[k:]
            samples, note = samples_of(probe, requests)
            runs.append(ProbeRun(probe, requests, samples, note))
            if progress is not None:
                progress(k + 1, len(plan), probe, samples, note)
    return runs, []
