"""Generated ``servelab simulate`` command lines: flag values, good and bad, through the CLI.

Each case starts from a run that works (a 3-request burst, JSON output into a fresh folder)
and sets zero to four flags from menus of valid and invalid values: sizes below 1 or past
their bounds, a token budget under the row limit, a utilisation of 0 or nan, a trace path
that is a folder or cannot be created, policy specs with parameters a run cannot honour.
The command must exit 0 with a summary that conserves the three requests (and the trace
written, when asked), or exit 2 with one line that names a flag it was given or its value;
a traceback, a vague line or an abort is *other*.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import strategies as st
from reliability.cases import CLEAN, CORRECT, OTHER, TIME_LIMIT_S, CaseClass, Hang, Outcome, time_limit

WORKLOAD = "burst:n=3,prompt=fixed(16),output=fixed(4)"
FLAGS: dict[str, tuple[list[str], list[str]]] = {  # flag -> (valid values, invalid values)
    "--instances": (["1", "2"], ["0", "-1", "5000", "x"]),
    "--max-num-seqs": (["8", "64", "256"], ["0", "-3", "99999999999"]),
    "--max-num-batched-tokens": (["256", "2048", "8192"], ["0", "1", "50", "-8"]),
    "--block-size": (["16", "32"], ["0", "-16"]),
    "--gpu-memory-utilization": (["0.9", "0.5"], ["0", "1.5", "nan", "-0.1"]),
    "--swap-space": (["0", "4"], ["-1", "nan", "1e9"]),
    "--max-model-len": (["4096", "64"], ["1", "1000000"]),
    "--on-overflow": (["reject", "truncate"], ["drop", ""]),
    "--preemption-mode": (["recompute"], ["kill"]),
    "--watchdog": (["on", "off", "events=1000", "events=0,idle_s=60"], ["events=-1", "x", "idle_s=nan"]),
    "--trace": (["@tmp/run.json"], ["@tmp", "/proc/forbidden/x.json"]),
    "--policy": (["vllm", "sarathi", "static", "infercept", "sarathi:token_budget=64"],
                 ["static:max_wait_s=1e300", "multibin:mu=-1", "multibin:edges=5;3;1", "vllm-pp:num_stages=3",
                  "infercept:host_gb=-1", "bogus"]),
    "--slo": (["ttft:2s", "none"], ["ttft:0", "x"]),
    "--model": (["Llama-2-7B"], ["Llama-9-1T"]),
}


@st.composite
def simulate_flags(draw) -> tuple[tuple[str, str], ...]:
    """(flag, value) pairs, each flag at most once; about half the cases use only valid values."""
    bad_ok = draw(st.booleans())
    flags = draw(st.lists(st.sampled_from(sorted(FLAGS)), max_size=4, unique=True))
    return tuple((flag, draw(st.sampled_from(FLAGS[flag][0] + (FLAGS[flag][1] if bad_ok else [])))) for flag in flags)


def run_simulate_flags(pairs: tuple[tuple[str, str], ...]) -> Outcome:
    from typer.testing import CliRunner

    from servelab.cli.main import app

    with tempfile.TemporaryDirectory(prefix="servelab-flags-") as tmp:
        args = [(flag, value.replace("@tmp", tmp)) for flag, value in pairs]
        argv = ["simulate", "-w", WORKLOAD, "--out", str(Path(tmp) / "out"), "--json"]
        for flag, value in args:
            argv += [flag, value]
        try:
            with time_limit(TIME_LIMIT_S):
                result = CliRunner().invoke(app, argv)
        except Hang as hang:
            return Outcome(OTHER, str(hang))
        if result.exit_code == 2 and "Invalid value for '" in result.output:  # click's usage error: not ours
            if not any(f"'{flag}'" in result.output for flag, _ in args):
                return Outcome(OTHER, f"usage error naming no flag given: {result.output[-300:]!r}")
            return Outcome(CLEAN, result.output.split("Invalid value for ")[1].split("\n")[0])
        if result.exit_code == 2:
            lines = [line for line in result.output.strip().splitlines() if line.strip()]
            message = lines[-1] if lines else ""
            named = any(_names(message, flag, value) for flag, value in args)
            if len(lines) != 1 or not message.startswith("error: ") or not named:
                return Outcome(OTHER, f"vague error for {args}: {result.output.strip()[:300]!r}")
            return Outcome(CLEAN, message)
        if result.exit_code != 0:
            detail = repr(result.exception) if result.exception else result.output[-300:]
            return Outcome(OTHER, f"exit {result.exit_code} for {args}: {detail}")
        return _verify(args, result.output)


def _names(message: str, flag: str, value: str) -> bool:
    words = {flag, flag.lstrip("-").replace("-", "_")} | ({value} if len(value) >= 3 else set())
    if flag == "--policy":  # a policy error names the policy (or preset) and its parameter
        words.add(f"'{value.partition(':')[0]}'")
    return any(word in message for word in words)


def _verify(args: list[tuple[str, str]], output: str) -> Outcome:
    try:
        summary = json.loads(output)
    except ValueError:
        return Outcome(OTHER, f"exit 0 for {args} without a JSON summary: {output[-200:]!r}")
    ended = summary["num_completed"] + summary["num_rejected"] + summary["num_aborted"]
    if summary["num_arrived"] != 3 or ended != 3 or not summary["conserved"]:
        return Outcome(OTHER, f"{args}: {summary['num_arrived']} arrived, {ended} ended")
    trace = dict(args).get("--trace")
    if trace is not None and not Path(trace).is_file():
        return Outcome(OTHER, f"{args}: exit 0 but no trace at {trace}")
    return Outcome(CORRECT)


FLAG_CASES = [CaseClass("simulate_flags", "`servelab simulate` flag values (CLI, 3-request burst)", simulate_flags(),
                        run_simulate_flags)]
