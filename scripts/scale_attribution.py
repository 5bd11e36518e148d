"""Where the extra CPU per simulated token goes at N instances (issue 29), by part of the
simulator, written to docs/benchmarks/scale_attribution.md.

    python scripts/scale_attribution.py [--sizes 1,32,256] [--gc-size 256] [--quick]

docs/benchmarks/scale_diagnosis.md lists functions; this groups them into the parts a
fix would change, so that the largest term is named by a measurement:

- the cluster event loop and its heap (``ClusterDriver.run`` / ``_dispatch``, ``EventQueue``,
  ``heapq``): grows if wake-ups or stale events pile up with the instances;
- arrivals and routing (``_on_arrival``, placements, the router, the least-loaded index,
  the cluster view): grows if the router does O(instances) work per arrival;
- per-step metrics (``metrics/``);
- the instance step path (the driver, the policy, the runtime, the KV block manager, the
  decode group, fast-forward, the cost model): the same work per step at every size, so its
  growth is more steps per token (the simulated cluster's) or slower calls (locality);
- Python's cyclic GC (timed by ``gc.callbacks`` in the runs without the profiler).

Each size runs in its own process under cProfile (``scale_diagnosis.point``: one instance
runs several workloads back to back, the others one; the least-loaded router at every size),
and again without the profiler for the speed and the GC time. A built-in's CPU (a list's
``append``, ``heapq.heappop``) is charged to the part whose function called it (cProfile's
callers). The growth of each part from one instance is split exactly into more calls per
token (at one instance's time per call) and slower calls (``scale_diagnosis.split_growth``).

``--gc-size N`` adds the collector experiment at N instances: Python's thresholds as the
simulator sets them, a young-generation threshold scaled with the instances, and
``gc.freeze()`` after set-up (the workload's specs, the instances), each timed without the
profiler with its fingerprint (same results).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scale_diagnosis as sd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks" / "scale_attribution.md"

PARTS = ("event loop and heap", "arrivals and routing", "metrics", "instance step path", "other")
_LOOP = ("cluster/driver.py", ("run", "_dispatch", "push_step_done", "push_callback"))
_ARRIVE = ("cluster/driver.py", ("_on_arrival", "apply", "_place", "add_to", "_arm_router_timer",
                                 "_on_arrivals_done", "end_request"))


def part_of(func: str) -> str:
    """The part of the simulator a profiled function ('file:line(name)') belongs to."""
    path, _, rest = func.partition(":")
    name = rest[rest.find("(") + 1:-1] if "(" in rest else rest
    if path == "cluster/driver.py":
        if name in _LOOP[1]:
            return "event loop and heap"
        if name in _ARRIVE[1]:
            return "arrivals and routing"
        return "instance step path"  # _on_step_done, _kick: a step's end and the next step's start
    if path == "core/events.py":
        return "event loop and heap"
    if path in ("cluster/load_index.py", "cluster/views.py", "baselines/routers.py", "core/admission.py"):
        return "arrivals and routing"
    if path.startswith("metrics/"):
        return "metrics"
    if path.startswith(("core/", "baselines/", "costmodel/", "cluster/")):
        return "instance step path"
    return "other"


def parts_per_token(p: dict) -> dict[str, tuple[dict, float]]:
    """Per part: {function -> (calls per 1k tok, ns per call, ns per tok)} and its ns per token,
    built-ins split among the parts of their callers in proportion to what each caller spent."""
    tok = p["output_tokens"]
    callers = p.get("builtin_callers") or {}
    out: dict[str, dict] = {part: {} for part in PARTS}
    for f, (calls, own) in p["funcs"].items():
        if f.startswith("~:") and callers.get(f):
            by = callers[f]
            spent = sum(by.values()) or 1.0
            for caller, own_c in by.items():
                share = own_c / spent
                key = f"{f} from {caller}"
                out[part_of(caller)][key] = (calls * share / tok * 1e3, own / calls * 1e9 if calls else 0.0,
                                             own * share / tok * 1e9)
            continue
        out[part_of(f)][f] = (calls / tok * 1e3, own / calls * 1e9 if calls else 0.0, own / tok * 1e9)
    return {part: (funcs, sum(v[2] for v in funcs.values())) for part, funcs in out.items()}


def attribution_lines(profiles: list[dict], plain: list[dict]) -> list[str]:
    sizes = [p["instances"] for p in profiles]
    sz = " / ".join(f"{n:,}" for n in sizes)
    parts = [parts_per_token(p) for p in profiles]
    totals = [sum(v[1] for v in ps.values()) for ps in parts]
    lines = [f"## 1. CPU per simulated token by part, at {sz} instances (profiled)", "",
             "*ns per tok*: the part's profiled CPU per simulated output token (cProfile adds a fixed cost to "
             "every call, so absolute numbers are inflated and growth from slower memory is understated). "
             f"*growth*: from {sizes[0]:,} to each larger size, split into more calls per token and slower calls.",
             "", f"| part | ns per tok ({sz}) | share at {sizes[-1]:,} | "
             + " | ".join(f"growth to {n:,}: more calls / slower calls" for n in sizes[1:]) + " |",
             "|---|---:|---:|" + "---:|" * (len(sizes) - 1)]
    for part in PARTS:
        vals = [ps[part][1] for ps in parts]
        cells = []
        for k in range(1, len(sizes)):
            more, slower = sd.split_growth(parts[0][part][0], parts[k][part][0])
            cells.append(f"{sum(more.values()):+,.0f} / {sum(slower.values()):+,.0f}")
        lines.append(f"| {part} | " + " / ".join(f"{v:,.0f}" for v in vals) + f" | {vals[-1] / totals[-1]:.0%} | "
                     + " | ".join(cells) + " |")
    lines.append("| **all** | " + " / ".join(f"{t:,.0f}" for t in totals) + " | 100% | "
                 + " | ".join(f"{t - totals[0]:+,.0f} total" for t in totals[1:]) + " |")
    lines += ["", "Without the profiler (the speed that counts) and the cyclic GC's share:", "",
              "| instances | output tok per CPU-s | vs one instance | step records per 1k tok | CPU us per step "
              "record | GC ns per tok | GC share | load avg (start-end) |", "|---:|---:|---:|---:|---:|---:|---:|---|"]
    one = plain[0]["tokens_per_cpu_s"]
    for p in plain:
        gc_ns = p["gc_cpu_s"] / p["output_tokens"] * 1e9
        lines.append(f"| {p['instances']:,} | {p['tokens_per_cpu_s']:,.0f} | {p['tokens_per_cpu_s'] / one:.2f} | "
                     f"{p['records_per_ktok']:.2f} | {sd.us_per_record(p):.1f} | {gc_ns:,.0f} | "
                     f"{p['gc_cpu_s'] / p['cpu_s']:.1%} | {p['load'][0]:.1f}-{p['load'][1]:.1f} |")
    lines += ["", *verdict(sizes, parts, totals, plain), ""]
    lines += top_growth(sizes, parts)
    return lines


def verdict(sizes: list[int], parts: list[dict], totals: list[float], plain: list[dict]) -> list[str]:
    """The largest term of the growth, from the table."""
    out = []
    for k in range(1, len(sizes)):
        growth = {part: parts[k][part][1] - parts[0][part][1] for part in PARTS}
        total = totals[k] - totals[0]
        big = max(growth, key=growth.get)
        steps = plain[k]["records_per_ktok"] / plain[0]["records_per_ktok"] - 1
        gc_ns = [p["gc_cpu_s"] / p["output_tokens"] * 1e9 for p in (plain[0], plain[k])]
        uninstr = [1e9 / p["tokens_per_cpu_s"] for p in (plain[0], plain[k])]
        out.append(f"From {sizes[0]:,} to {sizes[k]:,} instances the profiled CPU per token grows by {total:+,.0f} ns "
                   f"({total / totals[0]:+.0%}); the largest part of it is the {big} ({growth[big]:+,.0f} ns, "
                   f"{growth[big] / total:.0%} of the growth); "
                   + ", ".join(f"{p} {growth[p]:+,.0f}" for p in PARTS if p != big)
                   + f". The simulated cluster takes {steps:+.0%} step records per token. Without the profiler a "
                   f"token costs {uninstr[0]:,.0f} -> {uninstr[1]:,.0f} ns ({uninstr[1] - uninstr[0]:+,.0f}), of "
                   f"which the cyclic GC {gc_ns[1] - gc_ns[0]:+,.0f} ns.")
    return out


def top_growth(sizes: list[int], parts: list[dict], top: int = 12) -> list[str]:
    """The functions (built-ins by caller) whose ns per token grow most to the largest size."""
    a = {f: v for part in PARTS for f, v in parts[0][part][0].items()}
    b = {f: v for part in PARTS for f, v in parts[-1][part][0].items()}
    more, slower = sd.split_growth(a, b)
    growth = {f: more[f] + slower[f] for f in more}
    part = {f: p for p in PARTS for f in list(parts[0][p][0]) + list(parts[-1][p][0])}
    zero = (0.0, 0.0, 0.0)
    lines = [f"## 2. The {top} functions whose CPU per token grows most from {sizes[0]:,} to {sizes[-1]:,} instances", "",
             "| function | part | calls per 1k tok | ns per call | ns per tok | growth (more calls / slower calls) |",
             "|---|---|---:|---:|---:|---:|"]
    for f in sorted(growth, key=lambda f: -growth[f])[:top]:
        va, vb = a.get(f, zero), b.get(f, zero)
        lines.append(f"| `{f}` | {part.get(f, '?')} | {va[0]:.1f} -> {vb[0]:.1f} | {va[1]:,.0f} -> {vb[1]:,.0f} | "
                     f"{va[2]:,.0f} -> {vb[2]:,.0f} | {growth[f]:+,.0f} ({more[f]:+,.0f} / {slower[f]:+,.0f}) |")
    return lines + [""]


def gc_variants(instances: int) -> list[tuple[str, dict]]:
    """(label, environment of the run): the young-generation threshold the simulator used before
    this experiment, one scaled with the instances (a collection then spans the same simulated
    time per instance), and gc.freeze() after set-up."""
    scaled = 100_000 * max(instances // 32, 1)
    return [("young generation 100,000 (the simulator's setting before issue 29's GC work)",
             {"SERVELAB_GC_GEN0": "100000"}),
            (f"young generation {scaled:,} (100,000 per 32 instances)", {"SERVELAB_GC_GEN0": str(scaled)}),
            ("young generation 100,000 and gc.freeze() after set-up",
             {"SERVELAB_GC_GEN0": "100000", "SERVELAB_GC_FREEZE": "1"})]


def gc_lines(runs: list[tuple[str, dict]]) -> list[str]:
    base = runs[0][1]
    lines = [f"## 3. The cyclic GC at {base['instances']:,} instances", "",
             "| collector | output tok per CPU-s | vs the first row | GC CPU-s | GC share | same results "
             "| peak RSS (GB) | load avg (start-end) |", "|---|---:|---:|---:|---:|---|---:|---|"]
    for label, r in runs:
        lines.append(f"| {label} | {r['tokens_per_cpu_s']:,.0f} | {r['tokens_per_cpu_s'] / base['tokens_per_cpu_s']:.2f} | "
                     f"{r['gc_cpu_s']:.1f} | {r['gc_cpu_s'] / r['cpu_s']:.1%} | "
                     f"{'yes' if r['fingerprints'] == base['fingerprints'] else '**no**'} | {r['peak_rss_gb']:.2f} | "
                     f"{r['load'][0]:.1f}-{r['load'][1]:.1f} |")
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,32,256")
    ap.add_argument("--gc-size", type=int, default=256, help="instances of the GC experiment (0: none)")
    ap.add_argument("--quick", action="store_true", help="1, 4, 16 instances of 200 requests, GC at 16")
    args = ap.parse_args()
    sizes = [1, 4, 16] if args.quick else [int(x) for x in args.sizes.split(",")]
    per = 200 if args.quick else 977
    gc_size = 16 if args.quick else args.gc_size
    reps = {n: max(sizes[1] // n, 1) if n == 1 else 1 for n in sizes}
    profiles = [sd.point(n, per, reps[n], router="least_loaded", profile=True) for n in sizes]
    plain = [sd.point(n, per, reps[n], router="least_loaded") for n in sizes]
    cmd = "python scripts/scale_attribution.py" + (" --quick" if args.quick else
                                                   f" --sizes {args.sizes} --gc-size {args.gc_size}")
    lines = ["# The simulator at fleet scale: the extra CPU per token, by part", "",
             f"Written by `{cmd}`; do not edit by hand.", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores visible, Python {platform.python_version()}, "
             f"load average {os.getloadavg()[0]:.1f} when written, run at nice {os.nice(0)} on the shared machine; "
             "each run is in its own process and its row gives the load average at its start and end (CPU "
             "seconds, not wall time; the caches and memory bandwidth are shared with the other work).", "",
             f"Workload (simulated): docs/benchmarks/scale.md's, {per:,} requests per instance at 5.5 req/s per "
             "instance (prompts U(512,1536), outputs U(100,300)), `vllm` on simulated A100-80GB instances "
             f"serving Llama-2-7B, least-loaded router at every size; one instance runs {reps[sizes[0]]} workloads "
             "(seeds 0..) back to back, the other sizes one (seed 0).", ""]
    lines += attribution_lines(profiles, plain)
    if gc_size:
        runs = [(label, sd.point(gc_size, per, 1, router="least_loaded", env=env))
                for label, env in gc_variants(gc_size)]
        lines += gc_lines(runs)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
