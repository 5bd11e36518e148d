"""Write docs/reliability.md: how generated bad input ends, class by class. Never edit that
file by hand; run

    .venv/bin/python scripts/reliability_report.py [--examples N] [--cell-examples N] [--seed S] [--out PATH]

It needs the test dependencies (hypothesis: ``requirements-test.lock``). The report is a
list of section writers (``SECTIONS``), each a function of the run's
``ReportConfig`` returning markdown. The bad-input section runs the hypothesis case classes
of ``tests/reliability/cases.py`` and ``flag_cases.py`` (the ones the test suite runs) with a fixed seed and a
fixed number of examples, and tallies how each case ended: a clean ``UserError`` naming the
input, a verified correct result, or anything else. The conservation matrix runs the cells of
``tests/reliability/conservation.py`` (every policy, router and preset x adversarial case)
the same way. To add a section, write a function and put it in ``SECTIONS``.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the case classes live with the tests

EXAMPLES_PER_CLASS = 500
CELL_EXAMPLES = 10  # generated workloads per conservation-matrix cell
SEED = 8


@dataclass(frozen=True)
class ReportConfig:
    examples: int
    seed: int
    command: str
    cell_examples: int = CELL_EXAMPLES


def header(config: ReportConfig) -> str:
    import hypothesis

    return (
        "# Reliability: bad input and edge cases\n\n"
        "Written by a command, never by hand:\n\n"
        f"```bash\n{config.command}\n```\n\n"
        f"Python {platform.python_version()}, hypothesis {hypothesis.__version__}, seed {config.seed}, "
        f"{config.examples} generated cases per class.\n\n"
        "Every case ends in one of three ways. **Clean error**: a `UserError` whose message is one line and "
        "names the input (the spec string, the file and line, the parameter). **Correct result**: the call "
        "returned, and what it returned matches an independent reading of the generated input. **Other**: any "
        "other exception, a hang (over 10 s), a vague message, a valid input rejected, an invalid one accepted, "
        "or a result that disagrees with the input. The test suite (`tests/reliability`) runs the same classes "
        "with fresh random cases and fails on any *other*.\n"
    )


def bad_input_cases(config: ReportConfig) -> str:
    from reliability.cases import CASE_CLASSES, CLEAN, CORRECT, OTHER, tally
    from reliability.flag_cases import FLAG_CASES

    lines = ["## Generated bad input", "",
             "| class | what is generated | cases | clean error | correct result | other | seconds |",
             "|---|---|---:|---:|---:|---:|---:|"]
    totals = {CLEAN: 0, CORRECT: 0, OTHER: 0}
    examples_of_other = []
    for case_class in CASE_CLASSES + FLAG_CASES:
        start = time.perf_counter()
        counts, others = tally(case_class, config.examples, config.seed)
        seconds = time.perf_counter() - start
        for kind in totals:
            totals[kind] += counts[kind]
        lines.append(f"| `{case_class.name}` | {case_class.description} | {sum(counts.values())} | {counts[CLEAN]} | "
                     f"{counts[CORRECT]} | {counts[OTHER]} | {seconds:.1f} |")
        examples_of_other += [(case_class.name, example, detail) for example, detail in others[:5]]
    lines.append(f"| **all** | | **{sum(totals.values())}** | **{totals[CLEAN]}** | **{totals[CORRECT]}** | "
                 f"**{totals[OTHER]}** | |")
    if examples_of_other:
        lines += ["", "Cases that ended otherwise (up to 5 per class):", ""]
        lines += [f"- `{name}`: `{example!r:.160}` -> {detail[:200]}" for name, example, detail in examples_of_other]
    return "\n".join(lines) + "\n"


def cli_cases(config: ReportConfig) -> str:
    """The fixed table of bad command lines in tests/reliability/test_cli_errors.py."""
    import tempfile

    from reliability.test_cli_errors import CASES, _files
    from reliability.tiny_data import tiny_data_dir
    from typer.testing import CliRunner

    from servelab.cli.main import app

    ok = 0
    failures = []
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        _files(tmp)
        for args, expected in CASES:
            args = [a.replace("{tmp}", str(tmp)) for a in args]
            expected = expected.replace("{tmp}", str(tmp))
            if args[0] in ("simulate", "sweep", "capacity"):
                args += ["--data-dir", str(tiny_data_dir()), *(["--out", str(tmp / "out")] * (args[0] != "capacity"
                                                                                           and "--out" not in args))]
            res = CliRunner().invoke(app, args)
            lines = res.stderr.strip().splitlines()
            if res.exit_code == 2 and len(lines) == 1 and expected in lines[0] and "Traceback" not in res.output:
                ok += 1
            else:
                failures.append(f"- `servelab {' '.join(args)[:120]}`: exit {res.exit_code}, {res.output[-200:]!r}")
    return "\n".join([
        "## Bad command lines", "",
        f"{len(CASES)} fixed command lines, one per class of input that issues 8 and 22 found ending in a "
        "traceback, a vague error or a silently wrong result (`tests/reliability/test_cli_errors.py`). "
        f"**{ok} of {len(CASES)}** end with exit status 2 and one line on stderr that names the input.",
        *([""] + failures if failures else []), ""])


def limits(config: ReportConfig) -> str:
    from servelab.core import limits as lim
    from servelab.designs.multibin.theory import MAX_BINS
    from servelab.workloads.spec import MAX_MIX_DEPTH

    rows = [("tokens in one prompt or output", f"{lim.MAX_TOKENS:,}"),
            ("requests in a generated workload (`n=`)", f"{lim.MAX_NUM_REQUESTS:,}"),
            ("simulated instances (`-n`)", f"{lim.MAX_INSTANCES:,}"),
            ("span of arrival times", f"{lim.MAX_DURATION_S:.0e} s"),
            ("gamma arrival cv", f"{lim.MAX_CV:g}"),
            ("integer policy parameters", f"{lim.MAX_PARAM_INT:,}"),
            ("host KV per instance (`--swap-space`)", f"{lim.MAX_SWAP_SPACE_GB:g} GiB"),
            ("a policy or router duration (`max_wait_s`, `poll_s`, any `*_s`)", f"{lim.MAX_PARAM_SECONDS:g} s"),
            ("`mix(...)` nesting in `lengths=`", f"{MAX_MIX_DEPTH}"),
            ("`analyze multibin --k-max`", f"{MAX_BINS}")]
    return "\n".join(["## Documented bounds", "",
                      "Work that grows with a parameter rather than the input is bounded (`servelab/core/limits.py`); "
                      "a value beyond a bound is a clean error that quotes it.", "",
                      "| what | at most |", "|---|---:|", *[f"| {what} | {bound} |" for what, bound in rows], ""])


def conservation_matrix(config: ReportConfig) -> str:
    """Every system (policy or preset at 1 and 2 instances, router) x adversarial case of
    ``tests/reliability/conservation.py``: ``config.cell_examples`` generated workloads per
    cell, each simulated twice."""
    from reliability.conservation import MAX_REQUESTS, adversarial_cases, systems, tally_cell

    cases, rows = adversarial_cases(), systems()
    start = time.perf_counter()
    cells = {(s.label, c.name): tally_cell(s, c, config.cell_examples, config.seed) for s in rows for c in cases}
    seconds = time.perf_counter() - start
    lines = ["## Conservation matrix", "",
             f"Each cell: {config.cell_examples} workloads of 1 to {MAX_REQUESTS} requests generated for the case "
             "(hypothesis, the seed above), each simulated twice (simulated: `ToyCostModel` step times, the case's "
             "GPU and model for KV sizes and context). Counts are summed over the cell's runs as "
             "completed / rejected / aborted; **ok** means every run conserved its requests (arrived = completed + "
             "rejected + aborted, all ended), gave every rejection and abort a reason, stranded none (no case injects a "
             "fault, so a request aborted because the run ended is a problem), finished no request over the "
             "context, and repeated byte for byte. The test suite (`tests/reliability/test_conservation.py`) runs "
             f"the same cells with fresh workloads. {len(rows)} systems x {len(cases)} cases, {seconds:.0f} s.", "",
             "| case | what is generated | hardware |", "|---|---|---|"]
    lines += [f"| `{c.name}` | {c.description} | {c.hardware['gpu']}, {c.hardware['model']}"
              + (f", memory reserve {c.hardware['memory_reserve_fraction']}" if 'memory_reserve_fraction' in c.hardware
                 else "") + " |" for c in cases]
    lines += ["", "| system | " + " | ".join(f"`{c.name}`" for c in cases) + " |",
              "|---|" + "---:|" * len(cases)]
    for s in rows:
        row = []
        for c in cases:
            cell = cells[(s.label, c.name)]
            verdict = "ok" if not cell.problems else "**NO**"
            row.append(f"{cell.num_completed}/{cell.num_rejected}/{cell.num_aborted} {verdict}")
        lines.append(f"| `{s.label}` | " + " | ".join(row) + " |")
    total = {k: sum(getattr(cell, k) for cell in cells.values())
             for k in ("num_runs", "num_arrived", "num_completed", "num_rejected", "num_aborted")}
    bad = [(key, cell) for key, cell in cells.items() if cell.problems]
    lines += ["", f"All cells: {total['num_runs']:,} workloads, {total['num_arrived']:,} requests: "
              f"{total['num_completed']:,} completed, {total['num_rejected']:,} rejected, {total['num_aborted']:,} "
              f"aborted; **{len(cells) - len(bad)} of {len(cells)} cells ok**."]
    if bad:
        lines += ["", "Cells with a problem (first problem of each):", ""]
        lines += [f"- `{label}` x `{case}`: {cell.problems[0][1][:200]} (workload "
                  f"`{[(r.arrival_time_s, r.num_prompt_tokens, r.num_output_tokens) for r in cell.problems[0][0].specs]!r:.300}`)"
                  for (label, case), cell in bad]
    aborted = [(key, cell) for key, cell in cells.items() if cell.num_aborted]
    if aborted:
        lines += ["", "Aborts are conserved (each has a reason), but each is a stranded request. Where they happen, "
                  "with the most common reason, and again with one suspected cause removed (the hypothesis: "
                  "`Mover._finish` in `servelab/cluster/moves.py` frees a handed-off request's KV at its source but "
                  "does not wake the source, so an idle prefill instance whose blocks were all held by outgoing KV "
                  "never runs its queue again; the experiment reruns the cell with the source woken):", "",
                  "| system x case | aborted | most common reason | aborted with the source woken |",
                  "|---|---:|---|---:|"]
        with _source_woken_after_transfers():
            again = {key: tally_cell(next(s for s in rows if s.label == key[0]),
                                     next(c for c in cases if c.name == key[1]), config.cell_examples, config.seed)
                     for key, _ in aborted}
        for (label, case), cell in aborted:
            reason, count = cell.abort_reasons.most_common(1)[0]
            after = again[(label, case)]
            lines.append(f"| `{label}` x `{case}` | {cell.num_aborted} of {cell.num_arrived} | {count} x {reason} | "
                         f"{after.num_aborted} of {after.num_arrived} |")
    return "\n".join(lines) + "\n"


LIVELOCK_CASES = [("infercept", 20, 1, 0.0), ("infercept", 100, 1, 0.0), ("infercept", 100, 2, 0.0),
                  ("infercept:preemption=swap", 20, 1, 4.0), ("infercept:preemption=swap", 100, 2, 4.0)]


def limits_that_hold(config: ReportConfig) -> str:
    """Issue 22: the InferCept livelock cases end on their own (watchdog off), no step passes the
    step token limit under any policy, and what the workload memory check allows here."""
    import collections
    import signal

    from servelab import api
    from servelab.cluster.watchdog import WatchdogConfig
    from servelab.workloads.memory import memory_limit_bytes, workload_bytes

    lines = ["## Limits that hold", "",
             "**A simulation always ends.** InferCept on a tiny KV cache used to run for ever (issue 22): "
             "`burst:n=N,prompt=uniform(200,2500),output=uniform(50,1500)` on Llama-2-7B / A100-40GB at "
             "`--gpu-memory-utilization 0.37` (287 KV blocks per instance). Simulated (roofline cost model), "
             "with the progress watchdog off, so each run ends because the scheduler never stalls (a run is "
             "stopped after 60 s of CPU):", "",
             "| policy | requests | instances | swap space | completed / rejected / aborted | simulated s | CPU s |",
             "|---|---:|---:|---:|---|---:|---:|"]

    def hang(signum, frame):
        raise TimeoutError

    for policy, n, instances, swap in LIVELOCK_CASES:
        wl = api.load_workload(f"burst:n={n},prompt=uniform(200,2500),output=uniform(50,1500)")
        hw = api.HardwareChoice(num_instances=instances, gpu="A100-40GB", model="Llama-2-7B",
                                gpu_memory_utilization=0.37, swap_space_gb=swap)
        previous = signal.signal(signal.SIGALRM, hang)
        signal.alarm(60)
        try:
            out = api.run_simulation(wl, policy, hw, watchdog=WatchdogConfig(enabled=False))
            ended = collections.Counter(r.status.value for r in out.result.requests)
            cells = (f"{ended['finished']} / {ended['rejected']} / {ended['aborted']}", f"{out.result.makespan_s:,.1f}",
                     f"{out.cpu_s:.2f}")
        except TimeoutError:
            cells = ("**did not end in 60 s**", "-", "> 60")
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        lines.append(f"| `{policy}` | {n} | {instances} | {swap:g} GiB | " + " | ".join(cells) + " |")
    lines += ["", "Any other stall is ended by the watchdog (`servelab/cluster/watchdog.py`, `simulate --watchdog`): "
              "every live request is aborted with a `stuck:` reason (tests/cluster/test_watchdog.py drives it "
              "with a router that polls for ever and with moves that undo each other).", ""]
    lines += _step_limit_rows()
    limit, source = memory_limit_bytes()
    lines += ["", "**Workloads that cannot fit are refused before they are built** (`servelab/workloads/memory.py`: "
              "1,500 B a request and 48 B an output token, measured). Here the workload memory limit is "
              f"{limit / 2**30:.1f} GiB ({source}); 1M requests of 200 output tokens need "
              f"{workload_bytes(10**6, 2 * 10**8) / 2**30:.1f} GiB, `poisson:n=10000000` with `output=exp(200)` "
              f"{workload_bytes(10**7, 2 * 10**9) / 2**30:.0f} GiB.", ""]
    return "\n".join(lines)


def _step_limit_rows() -> list[str]:
    """Every policy and preset at 2 instances, --max-num-batched-tokens 64 --max-num-seqs 16: the
    largest step any instance ran (padded batches count their rectangle)."""
    from servelab import api
    from servelab.cluster.presets import PRESETS
    from servelab.core.instance import InstanceRuntime
    from servelab.core.policy import POLICIES

    wl = api.load_workload("poisson:rate=20,n=30,prompt=uniform(10,300),output=uniform(1,40)")
    apply, largest = InstanceRuntime.apply, {}

    def watched(self, plan, now_s):
        pad = plan.padding
        tokens = sum(plan.num_tokens) if pad is None else pad.num_rows * pad.row_tokens
        largest[id(self)] = max(largest.get(id(self), (0, 0)), (tokens, self.max_batch_tokens))
        return apply(self, plan, now_s)

    rows = ["**The step token limit is a limit.** Every policy and preset at 2 instances with "
            "`--max-num-batched-tokens 64 --max-num-seqs 16`, 30 Poisson requests of 10-300 prompt tokens "
            "(simulated, roofline, Llama-2-7B on A100-80GB): the largest step any instance ran (a padded batch "
            "counts rows x longest row; a pipeline group of k instances has k x 64) and how requests ended "
            "(policies that prefill whole reject prompts over 64 with the reason, chunking ones cut them):", "",
            "| policy | largest step (tokens) | limit of that instance | completed / rejected |", "|---|---:|---:|---|"]
    InstanceRuntime.apply = watched
    try:
        for name in POLICIES.names() + sorted(set(PRESETS) - set(POLICIES.names())):
            largest.clear()
            out = api.run_simulation(wl, name, api.HardwareChoice(num_instances=2, max_batch_tokens=64,
                                                                  max_num_seqs=16))
            tokens, limit = max(largest.values())
            s = out.summary
            rows.append(f"| `{name}` | {tokens} | {limit} | {s.num_completed} / {s.num_rejected} |")
    finally:
        InstanceRuntime.apply = apply
    return rows


@contextlib.contextmanager
def _source_woken_after_transfers():
    """The experiment above: wrap ``Mover._finish`` so the transfer's source instance is kicked
    after its copy is freed (a monkeypatch for this measurement only, undone on exit)."""
    from servelab.cluster import moves

    finish = moves.Mover._finish

    def finish_and_wake(self, t):
        finish(self, t)
        if t.source != moves.POOL and t.source in self.cluster.active:
            self.cluster.kick(t.source)

    moves.Mover._finish = finish_and_wake
    try:
        yield
    finally:
        moves.Mover._finish = finish


SECTIONS: list[Callable[[ReportConfig], str]] = [header, bad_input_cases, cli_cases, limits, limits_that_hold,
                                                 conservation_matrix]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=EXAMPLES_PER_CLASS, help="generated cases per class")
    parser.add_argument("--cell-examples", type=int, default=CELL_EXAMPLES,
                        help="generated workloads per conservation-matrix cell")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "reliability.md")
    args = parser.parse_args(argv)
    command = ".venv/bin/python scripts/reliability_report.py" + "".join(
        f" --{name} {value}" for name, value, default in (("examples", args.examples, EXAMPLES_PER_CLASS),
                                                          ("cell-examples", args.cell_examples, CELL_EXAMPLES),
                                                          ("seed", args.seed, SEED)) if value != default)
    config = ReportConfig(args.examples, args.seed, command, args.cell_examples)
    args.out.write_text("\n".join(section(config) for section in SECTIONS))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
