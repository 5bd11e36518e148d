"""Where `servelab serve`'s CPU goes during a load; writes docs/benchmarks/engine_profile.md.

    python scripts/engine_profile.py --py-spy PATH [--load short-32-burst] [--lock /tmp/quiet.lock --run-nice -15]

Issue 27 asks whether servelab loses to vLLM-CPU on the all-at-once loads because vLLM overlaps
its non-model work (scheduling, input tensors, sampling, output handling) with the model, or
because its model step is faster. This starts `servelab serve` with scripts/vs_vllm.py's set-up
(same checkpoint, dtype, limits; port 8233), samples the engine process with py-spy
(``pip install py-spy`` into any venv; it is not a servelab dependency) while `servelab bench`
sends one load, and splits the samples by what the engine thread was doing: the model's forward
(projections, attention, the rest), batch building, sampling, stop checks and detokenizing,
scheduling and the driver, and messages to the HTTP front end. CPU seconds of both processes
come from /proc. Samples of a process that waits for the next request are left out (py-spy
drops idle stacks), so the shares are of the engine's busy time.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from servelab.bench.vs_vllm import (Setup, _proc_stats, client_command, default_loads, quiet_slot,  # noqa: E402
                                    start_server, stop_server)

# (category, frame substrings: the first category with any of its frames in a stack takes it)
CATEGORIES = (
    ("model: projections", ("Linear.forward (servelab/engine/model.py",)),
    ("model: decode attention", ("split_kv_decode (", "dense_attention (", "decode (servelab/engine/paged_decode.py")),
    ("model: prefill attention", ("_prefill_attention (",)),
    ("model: KV writes and the rest of attend", ("RaggedMetadata.attend (", "PaddedMetadata.attend (")),
    ("model: the rest (norms, RoPE, MLP activation, embedding, logits)", ("Model.forward (", "Model.forward_padded (",
                                                                          "Model.forward_layers (")),
    ("batch building (input tensors, attention metadata)", ("build_ragged (", "build_padded (")),
    ("sampling", ("ModelRunner._sample (",)),
    ("stop checks and detokenizing", ("Executor._stops (",)),
    ("scheduling, driver, step bookkeeping", ("ClusterDriver", "InstanceDriver", "Executor.")),
    ("messages to and from the front end", ("Connection.", "_ChildService")),
)


def classify(stack: str) -> str:
    for name, frames in CATEGORIES:
        if any(f in stack for f in frames):
            return name
    return "other"


def read_samples(path: Path) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            counts[classify(stack)] += int(n)
    return counts


def children(pid: int) -> list[int]:
    return [p for p, (ppid, _) in _proc_stats().items() if ppid == pid]


def engine_pid(server_pid: int) -> int:
    """The engine process: the server's child that is not multiprocessing's resource tracker."""
    for pid in children(server_pid):
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        if b"spawn_main" in cmd:
            return pid
    raise SystemExit(f"no engine process under server pid {server_pid} (was it started with --engine-thread?)")


def cpu_s(pid: int) -> float:
    return _proc_stats()[pid][1] / os.sysconf("SC_CLK_TCK")


def render(counts: collections.Counter, cpu: dict[str, float], duration: float, load: str, setup: Setup,
           command: str, loadavg: tuple[float, float], nice: int | None) -> str:
    from servelab.engine.device import cpu_description

    total = sum(counts.values()) or 1
    model = sum(n for k, n in counts.items() if k.startswith("model:"))
    lines = ["# Where `servelab serve`'s CPU goes during a load (measured)", "",
             f"Written by `{command}`; rerun it rather than editing this file. Machine: {cpu_description()}, shared "
             f"with other sessions (1-minute load average {loadavg[0]:.2f} before, {loadavg[1]:.2f} after)"
             + (f"; the servers and client at nice {nice} under the benchmark lock" if nice is not None else "")
             + f". `servelab serve` with scripts/vs_vllm.py's set-up (bench-200m, {setup.dtype}, {setup.threads} torch "
             f"thread, {setup.kv_gib:g} GiB KV, max-num-seqs {setup.max_num_seqs}, {setup.max_num_batched_tokens} "
             f"batched tokens, block {setup.block_size}, policy vllm with chunked prefill); `servelab bench` sends "
             f"{load}. py-spy samples the engine process (50 Hz, idle stacks left out).", "",
             f"Duration {duration:.1f} s; CPU seconds during the load: engine process {cpu['engine']:.1f}, HTTP front "
             f"end {cpu['front']:.1f}.", "",
             "| engine process: what its thread was doing | samples | share |", "|---|---:|---:|"]
    for name, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {name} | {n:,} | {100 * n / total:.1f}% |")
    lines += ["", f"The model's forward is {100 * model / total:.1f}% of the engine's busy samples; everything "
              f"else the engine does per step is {100 - 100 * model / total:.1f}%, and the front end used "
              f"{cpu['front']:.1f} CPU s against the engine's {cpu['engine']:.1f}. Overlapping the non-model work "
              "with the forward (vLLM v1's async scheduling) could therefore shorten a step by at most that share; "
              "the rest of a gap to vLLM is the model step itself ([vs_vllm_steps.md](vs_vllm_steps.md)).", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--py-spy", default=shutil.which("py-spy"), help="py-spy executable (default: on PATH)")
    ap.add_argument("--checkpoint", type=Path, default=ROOT / "results" / "vs_vllm" / "bench200m")
    ap.add_argument("--load", default="short-32-burst")
    ap.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"))
    ap.add_argument("--lock", type=Path, default=None)
    ap.add_argument("--run-nice", type=int, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "engine_profile")
    ap.add_argument("--doc", type=Path, default=ROOT / "docs" / "benchmarks" / "engine_profile.md")
    args = ap.parse_args()
    if not args.py_spy or not Path(args.py_spy).is_file():
        ap.error("--py-spy: no py-spy executable (pip install py-spy into any venv and pass its path)")
    if not (args.checkpoint / "config.json").is_file():
        ap.error(f"--checkpoint {args.checkpoint}: no config.json (python scripts/vs_vllm.py creates it)")
    loads = {ld.name: ld for ld in default_loads()}
    if args.load not in loads or loads[args.load].poisson:
        ap.error(f"--load: one of {[n for n, ld in loads.items() if not ld.poisson]}, got {args.load!r}")
    load = loads[args.load]
    dtype = args.dtype
    if dtype == "auto":
        from servelab.engine.device import cpu_serving_dtype

        dtype = cpu_serving_dtype()
    setup = replace(Setup(checkpoint=args.checkpoint, vllm_python=Path("unused"), dtype=dtype), ports=(8233, 8234))
    args.out.mkdir(parents=True, exist_ok=True)
    server = start_server(setup, "servelab", args.out / "server.log")
    try:
        engine = engine_pid(server.pid)
        samples = args.out / "engine.spy"
        loadavg0 = os.getloadavg()[0]
        with quiet_slot(args.lock, [server.pid], args.run_nice):
            spy = subprocess.Popen([args.py_spy, "record", "--pid", str(engine), "--rate", "50", "--format", "raw",
                                    "-o", str(samples)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(2)  # py-spy attached
            cpu0 = {"engine": cpu_s(engine), "front": cpu_s(server.pid)}
            t0 = time.monotonic()
            subprocess.run(client_command(setup, "servelab", "servelab", load, float("inf"), args.out / "bench.json"),
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            duration = time.monotonic() - t0
            cpu = {k: (cpu_s(engine) if k == "engine" else cpu_s(server.pid)) - v for k, v in cpu0.items()}
            spy.send_signal(2)  # SIGINT: py-spy writes what it sampled and exits
            spy.wait(timeout=60)
    finally:
        stop_server(server)
    counts = read_samples(samples)
    command = "python scripts/engine_profile.py" + (f" --load {args.load}" if args.load != "short-32-burst" else "")
    if args.lock or args.run_nice is not None:
        command += (f" --lock {args.lock}" if args.lock else "") + (
            f" --run-nice {args.run_nice}" if args.run_nice is not None else "")
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    args.doc.write_text(render(counts, cpu, duration, f"{load.name} ({load.num_requests} requests x "
                                                      f"{load.prompt_tokens}/{load.output_tokens} tokens, all at once)",
                               setup, command, (loadavg0, os.getloadavg()[0]), args.run_nice))
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
