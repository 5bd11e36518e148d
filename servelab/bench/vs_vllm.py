"""The engine against vLLM's CPU build on one machine: both servers, both clients, same loads.

``python scripts/vs_vllm.py`` drives this. Both servers serve the same checkpoint with the same
dtype, torch threads, KV size, max-num-seqs, batched-token limit and block size; vLLM runs in
its own venv (``scripts/setup_vllm_venv.sh``). Each run is one load sent by one client
(``servelab bench`` or vLLM's ``vllm bench serve``) to one server, while the other server
idles; the two servers alternate first/second from run to run so that drift in the shared
machine's load hits both alike. Every finished run is appended to ``runs.jsonl`` at once, so
an interrupted benchmark resumes where it stopped (runs of another set-up are ignored).

A Poisson load's rate is ``rate_fraction`` of vLLM's capacity on the same prompts and count,
measured as requests / duration of the all-at-once load in the first repeat (servelab's
client), so both servers see the same arrivals near the reference engine's capacity.
This module imports neither torch nor vllm: it starts processes and reads their JSON.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

SERVERS = ("servelab", "vllm")
CLIENTS = ("servelab", "vllm")
VLLM_BENCH = ("from vllm.benchmarks import serve; from vllm.utils.argparse_utils import FlexibleArgumentParser as P; "
              "p = P(); serve.add_cli_args(p); serve.main(p.parse_args())")  # the `vllm` script needs metadata `vllm`
METRICS = ("duration", "completed", "total_input_tokens", "total_output_tokens", "output_throughput",
           "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms",
           "median_itl_ms", "median_e2el_ms")


@dataclass(frozen=True)
class Load:
    name: str
    prompt_tokens: int
    output_tokens: int
    num_requests: int
    poisson: bool  # False: all at once
    repeats: int  # default number of repeats (128-request loads take ~4x longer)

    @property
    def burst_name(self) -> str:
        return self.name.replace("poisson", "burst")


def default_loads(repeats_small: int = 2, repeats_large: int = 1) -> tuple[Load, ...]:
    """The issue's eight loads: short (256/64) and long (1,024/128) prompts, 32 and 128
    requests, all at once and Poisson; all-at-once first (the Poisson rates need them)."""
    loads = []
    for poisson in (False, True):
        for shape, p, o in (("short", 256, 64), ("long", 1024, 128)):
            for n in (32, 128):
                kind = "poisson" if poisson else "burst"
                loads.append(Load(f"{shape}-{n}-{kind}", p, o, n, poisson, repeats_small if n <= 32 else repeats_large))
    return tuple(loads)


@dataclass(frozen=True)
class Setup:
    checkpoint: Path
    vllm_python: Path
    servelab_python: Path = Path(sys.executable)
    dtype: str = "bfloat16"
    threads: int = 1
    kv_gib: float = 3.0
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 32  # vLLM's CPU attention needs a multiple of 32
    max_model_len: int = 4096
    rate_fraction: float = 0.9
    seed: int = 0
    ports: tuple[int, int] = (8231, 8232)  # servelab, vllm
    startup_timeout_s: float = 900.0  # vLLM's first start compiles the model

    def fingerprint(self) -> dict:
        """What must match for a recorded run to count (paths and ports may change)."""
        d = asdict(self)
        for key in ("vllm_python", "servelab_python", "ports", "startup_timeout_s"):
            d.pop(key)
        d["checkpoint"] = Path(self.checkpoint).name
        return d

    def port(self, server: str) -> int:
        return self.ports[SERVERS.index(server)]

    def url(self, server: str) -> str:
        return f"http://127.0.0.1:{self.port(server)}"


def server_command(setup: Setup, server: str) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "OMP_NUM_THREADS": str(setup.threads)}
    common = ["--model", str(setup.checkpoint), "--served-model-name", "model", "--dtype", setup.dtype,
              "--port", str(setup.port(server)), "--max-num-seqs", str(setup.max_num_seqs),
              "--max-num-batched-tokens", str(setup.max_num_batched_tokens), "--block-size", str(setup.block_size),
              "--max-model-len", str(setup.max_model_len)]
    if server == "servelab":  # vLLM v1 schedules chunked prefill with decodes first: servelab's sarathi
        return ([str(setup.servelab_python), "-m", "servelab.cli.main", "serve", *common, "--policy", "vllm",
                 "--enable-chunked-prefill", "--kv-budget-mb", f"{setup.kv_gib * 1024:g}", "--threads",
                 str(setup.threads), "--log-level", "warning"], env)
    env["VLLM_CPU_KVCACHE_SPACE"] = f"{setup.kv_gib:g}"
    return ([str(setup.vllm_python), "-m", "vllm.entrypoints.openai.api_server", *common, "--host", "127.0.0.1",
             "--no-enable-prefix-caching", "--uvicorn-log-level", "warning"], env)


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server for {url} exited with code {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(2)
    raise RuntimeError(f"server for {url} not ready after {timeout_s:.0f} s")


def _die_with(parent: int):
    """A ``preexec_fn``: the child gets SIGTERM when ``parent`` dies, even by SIGKILL (Linux
    ``PR_SET_PDEATHSIG``). Why: a server runs in its own session (so ``stop_server`` can signal
    its whole group), which also shields it from the signals that end the benchmark; a
    benchmark killed with -9 once left a vLLM server polling a core for 90 minutes."""
    def arm() -> None:
        import ctypes
        import signal

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # not Linux: stop_server is the only clean-up
            return
        if os.getppid() != parent:  # the parent died before the line above
            os._exit(1)
    return arm


def spawn_server(argv: list[str], env: dict[str, str] | None, log: Path) -> subprocess.Popen:
    """Start a server in its own session (its own process group), tied to this process's life."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as f:
        return subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_die_with(os.getpid()))


def start_server(setup: Setup, server: str, log: Path) -> subprocess.Popen:
    argv, env = server_command(setup, server)
    proc = spawn_server(argv, env, log)
    try:
        wait_ready(setup.url(server), proc, setup.startup_timeout_s)
    except BaseException:
        stop_server(proc)
        raise
    return proc


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group (vLLM forks an engine core and a worker), then KILL."""
    import signal

    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass


def client_command(setup: Setup, client: str, server: str, load: Load, rate: float, out: Path) -> list[str]:
    """Both clients greedy (vLLM's no longer defaults to temperature 0) with EOS ignored."""
    rate_text = "inf" if math.isinf(rate) else f"{rate:.6g}"
    if client == "servelab":
        workload = f"burst:n={load.num_requests},prompt=fixed({load.prompt_tokens}),output=fixed({load.output_tokens})"
        return [str(setup.servelab_python), "-m", "servelab.cli.main", "bench", "--base-url", setup.url(server),
                "--workload", workload, "--tokenizer", str(setup.checkpoint), "--prompt-format", "ids",
                "--model", "model", "--request-rate", rate_text, "--seed", str(setup.seed),
                "--result-dir", str(out.parent), "--result-filename", out.name, "--disable-tqdm"]
    return [str(setup.vllm_python), "-c", VLLM_BENCH, "--backend", "openai", "--base-url", setup.url(server),
            "--endpoint", "/v1/completions", "--model", "model", "--tokenizer", str(setup.checkpoint),
            "--dataset-name", "random", "--random-input-len", str(load.prompt_tokens), "--random-output-len",
            str(load.output_tokens), "--random-range-ratio", "0", "--num-prompts", str(load.num_requests),
            "--request-rate", rate_text, "--ignore-eos", "--temperature", "0", "--seed", str(setup.seed),
            "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name, "--percentile-metrics",
            "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99", "--disable-tqdm"]


@dataclass(frozen=True)
class RunKey:
    repeat: int
    load: str
    client: str
    server: str

    @property
    def stem(self) -> str:
        return f"r{self.repeat}-{self.load}-{self.client}-client-{self.server}-server"


@dataclass
class Record:
    key: RunKey
    rate: float
    metrics: dict
    load_avg_before: tuple[float, float, float]
    load_avg_after: tuple[float, float, float]
    wall_s: float
    setup: dict = field(default_factory=dict)
    nice: int | None = None  # the client's nice value (the servers' too when reniced for the run)
    commit: str | None = None  # servelab's git commit that ran (``+dirty``: with uncommitted changes)

    def to_json(self) -> dict:
        d = asdict(self)
        d["rate"] = None if math.isinf(self.rate) else self.rate
        return d

    @classmethod
    def from_json(cls, d: dict) -> Record:
        rate = math.inf if d["rate"] is None else d["rate"]
        return cls(RunKey(**d["key"]), rate, d["metrics"], tuple(d["load_avg_before"]), tuple(d["load_avg_after"]),
                   d["wall_s"], d.get("setup", {}), d.get("nice"), d.get("commit"))


def read_records(path: Path, setup: Setup) -> list[Record]:
    """Records of runs made with this set-up (a changed set-up starts over, keeping the file)."""
    if not path.is_file():
        return []
    records = [Record.from_json(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if r.setup == setup.fingerprint()]


def _proc_stats() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, utime + stime in clock ticks) of every process (Linux /proc)."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # ended meanwhile
            stats[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))  # ppid, utime + stime
    return stats


def process_tree(pid: int, stats: dict[int, tuple[int, int]] | None = None) -> set[int]:
    """``pid`` and every live descendant."""
    stats = _proc_stats() if stats is None else stats
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, (ppid, _) in stats.items() if ppid == parent and p not in tree]
        tree.update(children)
        frontier += children
    return tree


def process_tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and every live descendant (Linux /proc): what a
    server spent on a run, whatever else the shared machine was doing."""
    stats = _proc_stats()
    return sum(stats[p][1] for p in process_tree(pid, stats) if p in stats) / os.sysconf("SC_CLK_TCK")


def renice_trees(pids: list[int], value: int) -> None:
    """Set the nice value of every thread of every process in the trees of ``pids`` (Linux nice
    is per thread, and vLLM's processes have several); threads that end meanwhile are skipped."""
    stats = _proc_stats()
    for pid in {p for root in pids for p in process_tree(root, stats)}:
        try:
            tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, value)
            except (ProcessLookupError, PermissionError):
                pass


@contextlib.contextmanager
def quiet_slot(lock_path: Path | None, pids: list[int], run_nice: int | None):
    """One benchmark run's slot on a shared machine: hold ``lock_path`` (``flock``, shared with
    other benchmarks, so no two overlap) and run the servers and this process (so the client it
    starts) at ``run_nice``; between runs the lock is free and everything is back at the nice
    value this process started with (the servers start at it, so their start-up, compile and
    idle time do not hold the lock). ``run_nice`` None: no renicing; ``lock_path`` None: no lock."""
    import fcntl

    base = os.getpriority(os.PRIO_PROCESS, 0)
    f = None
    if lock_path is not None:
        f = open(lock_path, "a")  # noqa: SIM115 - held across the yield
        fcntl.flock(f, fcntl.LOCK_EX)
    try:
        if run_nice is not None:
            renice_trees([*pids, os.getpid()], run_nice)
        yield
    finally:
        if run_nice is not None:
            renice_trees([*pids, os.getpid()], base)
        if f is not None:
            fcntl.flock(f, fcntl.LOCK_UN)
            f.close()


class IncompleteRun(RuntimeError):
    """A client run in which not every request completed."""


def run_client(setup: Setup, key: RunKey, load: Load, rate: float, out_dir: Path, server_pid: int | None = None
               ) -> Record:
    out = out_dir / "runs" / f"{key.stem}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = client_command(setup, key.client, key.server, load, rate, out)
    before = os.getloadavg()
    cpu0 = process_tree_cpu_s(server_pid) if server_pid else None
    t0 = time.monotonic()
    with (out_dir / "clients.log").open("ab") as log:
        log.write(f"\n$ {' '.join(argv)}\n".encode())
        log.flush()
        subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=True)
    wall = time.monotonic() - t0
    data = json.loads(out.read_text())
    if data.get("completed") != load.num_requests:
        # a run with failed requests (a client timeout, a server error) is a shorter, different
        # run: its duration and rates compare nothing, so it is not kept
        errors = [e for e in data.get("errors") or [] if e]
        raise IncompleteRun(f"{key.stem}: {data.get('completed')} of {load.num_requests} requests completed"
                            + (f" (first error: {str(errors[0])[:120]})" if errors else "") + "; run not kept")
    metrics = {k: data.get(k) for k in METRICS}
    metrics["server_cpu_s"] = process_tree_cpu_s(server_pid) - cpu0 if server_pid else None
    return Record(key, rate, metrics, before, os.getloadavg(), wall, setup.fingerprint(),
                  os.getpriority(os.PRIO_PROCESS, 0))


def plan_runs(loads: tuple[Load, ...], vllm_client_loads: set[str], repeats: int | None) -> list[tuple[RunKey, Load]]:
    """Every run in order: repeat by repeat, loads in the given order, servelab's client then
    vLLM's, the two servers alternating which goes first."""
    runs, flip = [], 0
    max_repeats = max((repeats or ld.repeats) for ld in loads)
    for r in range(max_repeats):
        for load in loads:
            if r >= (repeats or load.repeats):
                continue
            clients = [c for c in CLIENTS if c == "servelab" or (load.name in vllm_client_loads and r == 0)]
            for client in clients:
                order = SERVERS if flip % 2 == 0 else SERVERS[::-1]
                flip += 1
                runs += [(RunKey(r, load.name, client, s), load) for s in order]
    return runs


def poisson_rate(load: Load, records: list[Record], fraction: float) -> float | None:
    """``fraction`` x vLLM's capacity on this load's all-at-once twin (repeat 0, servelab's
    client); None until that run exists."""
    for rec in records:
        k = rec.key
        if (k.repeat, k.load, k.client, k.server) == (0, load.burst_name, "servelab", "vllm"):
            return fraction * load.num_requests / rec.metrics["duration"]
    return None
