"""Run every command the README shows, from a fresh working folder, and say which failed.

    .venv/bin/python scripts/check_readme.py [--fast] [--readme README.md] [--timeout S]

Commands are the lines of the README's ```bash blocks that start with ``servelab`` or
``bash scripts/`` (``\\`` continuations joined, ``# comments`` dropped, ``[--flag]`` run with
the flag). They run in order in one temporary folder, so a command can use what an earlier
one wrote (``make-tiny-model /tmp/tiny`` before ``generate --model /tmp/tiny``);
``servelab serve`` starts in the background, the commands after it talk to it, and it is
stopped at the end. ``bash scripts/test.sh`` is not run: it is the test suite that runs this
check.

``--fast`` (what the test suite uses) runs every command with smaller sizes, rewritten by
``FAST_REWRITES`` (printed next to each command): shorter trace windows, fewer requests,
reduced reproductions and calibration grid, ``reproduce all --only multibin``. Nothing is
skipped for being slow.

Beyond the exit status, each run is checked for what a new user tripped over (issue 31):

- *writes where it says*: every path a command prints after ``wrote`` or ``results in``
  exists (relative to the fresh folder);
- *never over the committed docs*: nothing under the checkout's ``docs/`` changes;
- *reproduce all from a fresh folder*: its README.md is where it says and no design reads
  "No full report yet" (the committed full reports are found from any folder);
- *plots*: every figure a command saves (recorded by ``scripts/plot_probe``, a
  ``sitecustomize`` on the commands' ``PYTHONPATH``) has a title and both axis labels, and
  each label names its unit (``(ms)``, ``(req/s)``; ``UNITLESS`` lists the words that need
  none) and is not a raw key (``ttft_p99_s``). The plot table lists every figure.

Exit status 0 when every command exited 0 and every check passed, else 1 (tables say which).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOT_RUN = {"bash scripts/test.sh": "the test suite itself (it runs this check)"}
# (pattern, replacement): smaller sizes for --fast; each command still runs.
FAST_REWRITES: tuple[tuple[str, str], ...] = (
    (r"(scripts/demo\.sh)$", r"\1 --workload azure-conv:window=0-60"),
    (r"-w azure-conv ", "-w azure-conv:window=0-60 "),
    (r"window=0-600", "window=0-60"),
    # --reduced: Figure 5 on 16-64 tokens once, no calibration step (35 -> 17 CPU-s; the calibrated line
    # runs in tests/designs/multibin/test_engine_reproduction.py)
    (r"(servelab reproduce multibin-engine)\b", r"\1 --reduced --num-requests 8 --ks 1,2 --model {workdir}/tiny_fast"),
    (r"(servelab reproduce (?:multibin|bucketserve|dynaserve|alignedserve|kunserve))(?= |$)(?! --reduced)", r"\1 --reduced"),
    # the reduced BucketServe run takes ~75 CPU-s without the engine; --smoke runs every step and
    # claim row of the same code on the tests' tiny sizes (~15 CPU-s)
    (r"(servelab reproduce bucketserve --reduced)", r"\1 --no-engine --smoke"),
    # the reduced DynaServe run walks a rate grid over 3 seeds (~780 CPU-s, issue 26); --smoke runs
    # every step and claim row of the same code on tiny sizes, one seed (~20 CPU-s)
    (r"(servelab reproduce dynaserve --reduced)", r"\1 --seeds 1 --smoke"),
    (r"(servelab reproduce all)$", r"\1 --only multibin"),
    (r"(servelab calibrate .*)", r"\1 --grid reduced"),
    (r"(servelab generate .*)", r"\1 --max-tokens 16"),
    (r"burst:n=100,", "burst:n=8,"),
    (r"(servelab serve-vs-sim .*)--rates 0\.5,1,2\b", r"\1-w 'burst:n=4,prompt=fixed(32),output=fixed(8)' --rates 2"),
    (r"--rates 2,4,8\b", "--rates 4"),
    (r"gsm8k:n=(16|64)\b", "gsm8k:n=4"),
)
FAST_SETUP = ("servelab make-tiny-model {workdir}/tiny_fast",)  # what the rewrites above use
# Commands that need no engine and no earlier command's files: --quick runs only these.
QUICK = ("servelab simulate", "servelab sweep", "servelab capacity", "servelab analyze", "servelab perf simulator")


PROBE_DIR = ROOT / "scripts" / "plot_probe"
DOCS = ROOT / "docs"
# Axis labels that are a count or a share of something named in words need no unit.
UNITLESS = ("fraction", "share", "count", "number", "k", "bins", "batch size", "instances", "attainment",
            "servers", "ratio", "gain", "speedup", "cdf", "rank", "policy", "seed", "step", "layer", "groups", "rps")
_WROTE = re.compile(r"(?:\bwrote|results in) (?P<paths>.+)")


@dataclass
class Outcome:
    command: str
    ran: str
    status: str  # "ok", "failed (rc N)", "timed out", "not run: why"
    wall_s: float
    tail: str = ""
    cpu_s: float | None = None  # CPU seconds of the command and the processes it waited for


def _children_cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def readme_commands(text: str) -> list[str]:
    """The runnable lines of every ```bash block, continuations joined, comments dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = _strip_comment(line).strip()
            if line.startswith(("servelab ", "bash scripts/")):
                commands.append(" ".join(line.split()))
    return commands


def _strip_comment(line: str) -> str:
    """Drop a trailing ``# comment`` outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def as_run(command: str, fast: bool, workdir: Path) -> str:
    """``[--flag]`` runs with the flag, ``[--flag VALUE]`` (a placeholder) without it; --fast rewrites."""
    command = re.sub(r" ?\[--[a-z-]+ [A-Z_]+\]", "", command)
    command = re.sub(r"\[(--[a-z-]+)\]", r"\1", command)
    if fast:
        for pattern, replacement in FAST_REWRITES:
            command = re.sub(pattern, replacement.replace("{workdir}", str(workdir)), command)
    return command


def is_quick(command: str) -> bool:
    return command.startswith(QUICK) and "/tmp/" not in command


def _state_used(command: str) -> set[str]:
    """Files in /tmp the command reads or writes, and "server" when it starts or talks to ``serve``."""
    used = set(re.findall(r"/tmp/[\w.-]+", command))
    if "--base-url" in command or command.startswith("servelab serve "):
        used.add("server")
    return used


def chains(commands: list[str]) -> list[list[str]]:
    """The commands split into runs that need nothing from each other, README order kept.

    Two commands are in one chain when they share state, directly or through others: a /tmp
    file (``make-tiny-model /tmp/tiny`` before ``generate --model /tmp/tiny``) or the server that
    ``serve`` starts and ``bench`` talks to. Each chain runs in its own fresh folder, so the test
    suite runs them side by side (``--chain``)."""
    found: list[tuple[set[str], list[str]]] = []
    for command in commands:
        used = _state_used(command)
        joined = [c for c in found if c[0] & used]
        state, members = set(used), []
        for chain in joined:
            state |= chain[0]
            members += chain[1]
            found.remove(chain)
        found.append((state, sorted(members + [command], key=commands.index)))
    return sorted((members for _, members in found), key=lambda members: commands.index(members[0]))


def _argv(command: str) -> list[str]:
    argv = shlex.split(command)
    if argv[0] == "servelab":
        argv[0] = str(ROOT / ".venv" / "bin" / "servelab") if (ROOT / ".venv" / "bin" / "servelab").exists() \
            else "servelab"
    # files of the checkout named by a relative path (scripts/demo.sh, examples/simulate.toml)
    return [str(ROOT / a) if a.startswith(("scripts/", "examples/")) and (ROOT / a).exists() else a for a in argv]


def _port_of(command: str) -> int:
    match = re.search(r"--port (\d+)", command)
    return int(match.group(1)) if match else 8000


def _wait_for_port(port: int, proc: subprocess.Popen, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and proc.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.5)
    return False


def stated_paths(stdout: str) -> list[str]:
    """Paths a command says it wrote: after ``wrote`` (comma-separated) or ``results in``."""
    paths = []
    for match in _WROTE.finditer(stdout):
        for word in re.split(r",\s*|\s+and\s+|\s+", match.group("paths")):
            word = word.strip(" .;:()`'\"")
            if "/" in word and not word.startswith(("http", "<")) and "<" not in word:
                paths.append(word.rstrip("/"))
    return paths


def check_outputs(command: str, stdout: str, workdir: Path) -> str:
    """'' when what the command says it wrote is there (and, for reproduce all, complete), else why not."""
    missing = [p for p in stated_paths(stdout) if not (workdir / p).exists()]
    if missing:
        return f"said it wrote {', '.join(missing[:3])}: not there"
    if command.startswith("servelab reproduce all"):
        readme = workdir / "results" / "reproduction" / "README.md"
        if not readme.is_file():
            return f"no {readme.relative_to(workdir)}"
        text = readme.read_text()
        if "No full report yet" in text or "is missing" in text:
            return "README.md says a full report is missing (the committed ones were not found)"
    return ""


def docs_state() -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(ROOT)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in DOCS.rglob("*") if p.is_file()} if DOCS.is_dir() else {}


def run_all(commands: list[str], fast: bool, timeout_s: float, workdir: Path) -> list[Outcome]:
    outcomes, server = [], None
    probe = workdir / ".plot_probe"
    probe.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SERVELAB_PLOT_PROBE": str(probe),
           "PYTHONPATH": os.pathsep.join(x for x in (str(PROBE_DIR), os.environ.get("PYTHONPATH", "")) if x)}
    if fast and any("{workdir}" in r and re.search(p, c) for p, r in FAST_REWRITES for c in commands):
        for setup in FAST_SETUP:
            subprocess.run(_argv(setup.replace("{workdir}", str(workdir))), cwd=workdir, env=env, check=True,
                           capture_output=True, timeout=timeout_s)
    try:
        for command in commands:
            if command in NOT_RUN:
                outcomes.append(Outcome(command, command, f"not run: {NOT_RUN[command]}", 0.0))
                continue
            ran = as_run(command, fast, workdir)
            t0 = time.monotonic()
            if ran.startswith("servelab serve "):
                log = open(workdir / "serve.log", "w")
                server = subprocess.Popen(_argv(ran), cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
                ok = _wait_for_port(_port_of(ran), server, timeout_s)
                tail = "" if ok else (workdir / "serve.log").read_text()[-800:]
                outcomes.append(Outcome(command, ran, "ok (serving)" if ok else "failed (never listened)",
                                        time.monotonic() - t0, tail))
                continue
            cpu0 = _children_cpu_s()
            try:
                res = subprocess.run(_argv(ran), cwd=workdir, env=env, capture_output=True, text=True,
                                     timeout=timeout_s)
                status = "ok" if res.returncode == 0 else f"failed (rc {res.returncode})"
                tail = "" if res.returncode == 0 else (res.stdout[-400:] + res.stderr[-800:])
                why = check_outputs(ran, res.stdout, workdir) if res.returncode == 0 else ""
                if why:
                    status, tail = f"failed ({why})", res.stdout[-600:]
            except subprocess.TimeoutExpired:
                status, tail = "timed out", ""
            outcomes.append(Outcome(command, ran, status, time.monotonic() - t0, tail, _children_cpu_s() - cpu0))
    finally:
        if server is not None and server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
    return outcomes


@dataclass
class PlotCheck:
    path: str
    title: str
    axes: str  # "x label | y label" of each visible axes, "; "-separated
    problems: str  # "" when it has a title, labels and units


def _label_problem(label: str, axis: str) -> str:
    if not label.strip():
        return f"no {axis} label"
    if re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)+", label.strip()):
        return f"{axis} label is a raw key ({label})"
    words = label.lower()
    if "(" in label or "[" in label or "/" in label or "%" in label or any(re.search(rf"\b{re.escape(w)}\b", words) for w in UNITLESS):
        return ""
    return f"{axis} label has no unit ({label})"


def check_plots(probe: Path, workdir: Path) -> list[PlotCheck]:
    """Every figure the commands saved: a title, axis labels with units, no raw keys."""
    import json

    checks = []
    for record in sorted(probe.glob("*.json")):
        info = json.loads(record.read_text())
        visible = [a for a in info["axes"] if a["visible"]]
        titles = [info["suptitle"]] + [a["title"] for a in visible]
        problems = [] if info["suptitle"] or (visible and all(a["title"] for a in visible)) else ["no title"]
        for k, a in enumerate(visible):
            for axis in ("x", "y"):
                if a.get(f"{axis}_categorical") and not a[f"{axis}label"]:
                    continue  # named categories on the ticks (bars per policy) need no axis label
                why = _label_problem(a[f"{axis}label"], axis)
                if why:
                    problems.append(why + (f" in panel {k + 1}" if len(visible) > 1 else ""))
        path = info["path"]
        shown = os.path.relpath(path, workdir) if path.startswith(str(workdir)) else path
        checks.append(PlotCheck(shown, " ".join(" / ".join(t for t in titles if t).split())[:80],
                                "; ".join(f"{a['xlabel']} | {a['ylabel']}" for a in visible)[:120],
                                "; ".join(dict.fromkeys(problems))))
    return checks


def plot_report(checks: list[PlotCheck]) -> str:
    lines = ["| plot | title | axes (x \\| y) | check |", "|---|---|---|---|"]
    bar = "\\|"
    for c in checks:
        axes = c.axes.replace("|", bar)
        lines.append(f"| `{c.path}` | {c.title} | {axes} | {c.problems or 'ok'} |")
    return "\n".join(lines)


def report(outcomes: list[Outcome]) -> str:
    lines = ["| # | command (as run) | status | wall s | CPU s |", "|---:|---|---|---:|---:|"]
    for k, o in enumerate(outcomes, start=1):
        cpu = "-" if o.cpu_s is None else f"{o.cpu_s:.1f}"
        lines.append(f"| {k} | `{o.ran}` | {o.status} | {o.wall_s:.1f} | {cpu} |")
    for o in outcomes:
        if o.tail:
            lines.append(f"\n{o.ran} ->\n{o.tail}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fast", action="store_true", help="smaller sizes (FAST_REWRITES); every command still runs")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    ap.add_argument("--timeout", type=float, default=900.0, help="per command, seconds")
    ap.add_argument("--quick", action="store_true", help="only the simulator commands that need no earlier "
                                                         "command (QUICK; the test suite's bounded run)")
    ap.add_argument("--skip-quick", action="store_true", help="every command but the QUICK ones (the test suite "
                                                              "runs those apart with --quick, so its whole-README "
                                                              "run need not repeat them)")
    ap.add_argument("--chain", type=int, metavar="N", help="only the N-th (from 0) of the selected commands' "
                                                          "chains (see chains(); --list-chains prints them)")
    ap.add_argument("--list-chains", action="store_true", help="print the chains of the selected commands and exit")
    ap.add_argument("--doc", type=Path, help="also write the table as markdown here (docs/readme_check.md)")
    args = ap.parse_args()
    commands = readme_commands(args.readme.read_text())
    if args.quick and args.skip_quick:
        ap.error("--quick and --skip-quick exclude each other")
    if args.quick:
        commands = [c for c in commands if is_quick(c)]
    if args.skip_quick:
        commands = [c for c in commands if not is_quick(c)]
    if args.list_chains:
        print("\n".join(f"{k}: " + " && ".join(chain) for k, chain in enumerate(chains(commands))))
        return 0
    if args.chain is not None:
        found = chains(commands)
        if not 0 <= args.chain < len(found):
            ap.error(f"--chain {args.chain}: the selected commands form {len(found)} chains (0-{len(found) - 1})")
        commands = found[args.chain]
    t0 = time.process_time()
    docs_before = docs_state()
    with tempfile.TemporaryDirectory(prefix="readme_check_") as tmp:
        outcomes = run_all(commands, args.fast, args.timeout, Path(tmp))
        plots = check_plots(Path(tmp) / ".plot_probe", Path(tmp))
    docs_after = docs_state()
    touched = sorted(k for k in docs_before.keys() | docs_after.keys() if docs_before.get(k) != docs_after.get(k))
    table = report(outcomes)
    failed = [o for o in outcomes if not (o.status.startswith("ok") or o.status.startswith("not run"))]
    bad_plots = [c for c in plots if c.problems]
    verdict = (f"{len(outcomes) - len(failed)} of {len(outcomes)} README commands ok"
               + (" (--fast)" if args.fast else "") + (" (--quick)" if args.quick else "")
               + (" (--skip-quick)" if args.skip_quick else "")
               + (f" (--chain {args.chain})" if args.chain is not None else "")
               + f"; {len(plots) - len(bad_plots)} of {len(plots)} plots with a title and labelled axes with units"
               + f"; committed docs/ {'changed: ' + ', '.join(touched[:5]) if touched else 'untouched'}")
    table += "\n\n## Plots the commands saved\n\n" + plot_report(plots) if plots else ""
    print(f"{table}\n\n{verdict}")
    if args.doc:
        flags = " ".join(f for f, on in (("--fast", args.fast), ("--quick", args.quick),
                                           ("--skip-quick", args.skip_quick)) if on)
        args.doc.write_text(f"# The README's commands, run\n\nGenerated by `python scripts/check_readme.py {flags} "
                            f"--doc {args.doc}`; do not edit by hand. Each command ran in order in one fresh "
                            f"temporary folder on this machine ({os.cpu_count()} cores, shared); --fast sizes are "
                            f"the `FAST_REWRITES` in scripts/check_readme.py. *CPU s* is the command's own and its children's "
                            f"(the machine's load stretches wall time, not CPU time).\n\n{table}\n\n{verdict}.\n")
    return 1 if failed or bad_plots or touched else 0


if __name__ == "__main__":
    sys.exit(main())
