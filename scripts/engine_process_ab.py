"""`servelab serve` with the engine in its own process against the engine on a thread of the HTTP
process (issue 27 item 1), same load, same machine; writes docs/benchmarks/engine_process.md.

    python scripts/engine_process_ab.py [--load short-32-burst] [--repeats 3]

Both servers run at once with scripts/vs_vllm.py's servelab set-up (bench-200m, bf16, one torch
thread, 3 GiB KV, chunked prefill); `servelab bench` sends the load to one while the other idles,
alternating which goes first in each repeat. Reports duration, TTFT / TPOT medians and the
server's CPU seconds (its whole process tree, from /proc) per variant, and their ratio.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from servelab.bench.vs_vllm import (RunKey, Setup, default_loads, run_client, server_command,  # noqa: E402
                                    stop_server, wait_ready)

VARIANTS = {"process": [], "thread": ["--engine-thread"]}


def start(setup: Setup, extra: list[str], log: Path):
    import subprocess

    argv, env = server_command(setup, "servelab")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as f:
        proc = subprocess.Popen(argv + extra, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(setup.url("servelab"), proc, setup.startup_timeout_s)
    except BaseException:
        stop_server(proc)
        raise
    return proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--load", default="short-32-burst")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--checkpoint", type=Path, default=ROOT / "results" / "vs_vllm" / "bench200m")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "engine_process_ab")
    ap.add_argument("--doc", type=Path, default=ROOT / "docs" / "benchmarks" / "engine_process.md")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    load = next((ld for ld in default_loads() if ld.name == args.load), None)
    if load is None:
        ap.error(f"--load: {args.load!r} is not one of {[ld.name for ld in default_loads()]}")
    if not (args.checkpoint / "config.json").is_file():
        ap.error(f"--checkpoint: no checkpoint at {args.checkpoint} (python scripts/vs_vllm.py makes it)")
    base = Setup(checkpoint=args.checkpoint, vllm_python=Path("/nonexistent"), servelab_python=Path(sys.executable))
    setups = {"process": replace(base, ports=(8241 + 10, 0)), "thread": replace(base, ports=(8242 + 10, 0))}
    procs, records = {}, {v: [] for v in VARIANTS}
    loads = []
    try:
        for v, extra in VARIANTS.items():
            print(f"starting the engine-{v} server ...", flush=True)
            procs[v] = start(setups[v], extra, args.out / f"{v}-server.log")
        for r in range(args.repeats):
            order = list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]
            for v in order:
                rec = run_client(setups[v], RunKey(r, load.name, "servelab", "servelab"), load, float("inf"),
                                 args.out / v, procs[v].pid)
                records[v].append(rec.metrics)
                loads += [rec.load_avg_before[0], rec.load_avg_after[0]]
                print(f"repeat {r} engine-{v}: {rec.metrics['duration']:.1f} s, server CPU "
                      f"{rec.metrics['server_cpu_s']:.1f} s, load avg {rec.load_avg_after[0]:.2f}", flush=True)
    finally:
        for proc in procs.values():
            stop_server(proc)

    def med(v: str, key: str) -> float:
        return statistics.median(m[key] for m in records[v])

    lines = ["# The engine in its own process against the engine on a thread (measured)", "",
             f"Written by `python scripts/engine_process_ab.py --load {load.name} --repeats {args.repeats}`; rerun it "
             f"rather than editing this file. Machine: {os.cpu_count()} cores shared with other sessions (1-minute "
             f"load average {min(loads):.2f}-{max(loads):.2f} around the runs). `servelab serve` with scripts/"
             "vs_vllm.py's set-up (bench-200m, bfloat16, 1 torch thread, 3 GiB KV, max-num-seqs 64, chunked prefill "
             "with 2,048 tokens a step), both servers up at once, `servelab bench` sending "
             f"{load.name} ({load.num_requests} requests x {load.prompt_tokens}/{load.output_tokens} tokens, all at "
             f"once) to one while the other idles, alternating which goes first; medians of {args.repeats}.", "",
             "| engine | duration (s) | server CPU (s) | output tok/s | TTFT p50 (ms) | TPOT p50 (ms) | runs: duration "
             "(s) |", "|---|---:|---:|---:|---:|---:|---|"]
    for v in VARIANTS:
        runs = ", ".join(f"{m['duration']:.1f}" for m in records[v])
        lines.append(f"| {v} | {med(v, 'duration'):.1f} | {med(v, 'server_cpu_s'):.1f} | "
                     f"{med(v, 'output_throughput'):.1f} | {med(v, 'median_ttft_ms'):,.0f} | "
                     f"{med(v, 'median_tpot_ms'):,.0f} | {runs} |")
    lines += ["", f"Process / thread: duration {med('process', 'duration') / med('thread', 'duration'):.2f}x, server "
              f"CPU {med('process', 'server_cpu_s') / med('thread', 'server_cpu_s'):.2f}x.", ""]
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    args.doc.write_text("\n".join(lines))
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
