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
reduced reproductions and calibration grid. Nothing is skipped for being slow.
Exit status 0 when every command exited 0, else 1 (a table says which).
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
    (r"(servelab reproduce multibin-engine)\b", r"\1 --num-requests 8 --ks 1,2 --model {workdir}/tiny_fast"),
    (r"(servelab reproduce (?:multibin|bucketserve|dynaserve|alignedserve|kunserve))(?= |$)(?! --reduced)", r"\1 --reduced"),
    (r"(servelab reproduce bucketserve --reduced)", r"\1 --no-engine"),
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


@dataclass
class Outcome:
    command: str
    ran: str
    status: str  # "ok", "failed (rc N)", "timed out", "not run: why"
    wall_s: float
    tail: str = ""


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


def run_all(commands: list[str], fast: bool, timeout_s: float, workdir: Path) -> list[Outcome]:
    outcomes, server = [], None
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if fast and any("{workdir}" in r for _, r in FAST_REWRITES):
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
            try:
                res = subprocess.run(_argv(ran), cwd=workdir, env=env, capture_output=True, text=True,
                                     timeout=timeout_s)
                status = "ok" if res.returncode == 0 else f"failed (rc {res.returncode})"
                tail = "" if res.returncode == 0 else (res.stdout[-400:] + res.stderr[-800:])
            except subprocess.TimeoutExpired:
                status, tail = "timed out", ""
            outcomes.append(Outcome(command, ran, status, time.monotonic() - t0, tail))
    finally:
        if server is not None and server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
    return outcomes


def report(outcomes: list[Outcome]) -> str:
    lines = ["| # | command (as run) | status | wall s |", "|---:|---|---|---:|"]
    for k, o in enumerate(outcomes, start=1):
        lines.append(f"| {k} | `{o.ran}` | {o.status} | {o.wall_s:.1f} |")
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
    ap.add_argument("--doc", type=Path, help="also write the table as markdown here (docs/readme_check.md)")
    args = ap.parse_args()
    commands = readme_commands(args.readme.read_text())
    if args.quick:
        commands = [c for c in commands if is_quick(c)]
    t0 = time.process_time()
    with tempfile.TemporaryDirectory(prefix="readme_check_") as tmp:
        outcomes = run_all(commands, args.fast, args.timeout, Path(tmp))
    table = report(outcomes)
    failed = [o for o in outcomes if not (o.status.startswith("ok") or o.status.startswith("not run"))]
    verdict = (f"{len(outcomes) - len(failed)} of {len(outcomes)} README commands ok"
               + (" (--fast)" if args.fast else "") + (" (--quick)" if args.quick else ""))
    print(f"{table}\n\n{verdict}")
    if args.doc:
        flags = " ".join(f for f, on in (("--fast", args.fast), ("--quick", args.quick)) if on)
        args.doc.write_text(f"# The README's commands, run\n\nGenerated by `python scripts/check_readme.py {flags} "
                            f"--doc {args.doc}`; do not edit by hand. Each command ran in order in one fresh "
                            f"temporary folder on this machine ({os.cpu_count()} cores, shared); --fast sizes are "
                            f"the `FAST_REWRITES` in scripts/check_readme.py.\n\n{table}\n\n{verdict}.\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
