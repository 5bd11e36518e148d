"""The reproduction runner: one loop for every paper's reproduction.

A reproduction is a list of experiments; an experiment is a function from the setting (the
sizes, the seed, the options, the results of the experiments before it) to rows. The runner
owns everything else: sizes (full or reduced), seeds and repeats, the CPU time of each step,
progress with an ETA, results written as they come (a ``.partial.json`` beside the report,
kept if the run is interrupted), temporary folders removed on Ctrl-C or SIGTERM, the results
JSON, and the report's skeleton (``claims``, ``plots``). ``servelab reproduce NAME`` runs one
through ``registry``.

How a design adds an experiment
-------------------------------
1. Write the experiment in the design's ``reproduce/experiments.py`` as a function of the
   setting, returning rows (dicts of plain numbers)::

       def burst_depth(run: Run) -> list[dict]:
           return [run_system(name, workload(run.sizes, factor), run.seed) for factor in (2, 3, 4)]

   Several seeds: ``run.over_seeds(lambda seed: ...)`` returns a ``stats.SeedRuns``, whose
   ``interval("ttft_p99_s")`` is the mean with a t (or ``method="bootstrap"``) interval over
   ``run.seeds`` (``--seeds N`` on the command line when the registry entry allows it).
2. Add a ``Step(label, fn, key)`` to the design's ``steps`` list (``reproduce/run.py``): the
   runner times it, stores its value at ``results[key]`` and writes the partial results.
   A step may read what earlier steps stored (``run.results["capacity"]``).
3. Report it: the design's ``write`` turns ``run.results`` into plots (``plots.save``) and its
   markdown report; claims go in a ``claims.Claim`` table, with ``Premise`` entries for the
   quantities that decide whether the paper's mechanism can act at that operating point.
4. Variants: a ``Variant(name, help, sizes={...}, options={...})`` in the reproduction reruns
   everything with those fields replaced (``--variant NAME``), into ``<name>-<variant>`` files.

A new design adds a ``Reproduction`` in ``designs/<name>/reproduce/run.py`` and one
``registry.Entry`` (its name, paper, options and measured duration, for ``--help``).
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from servelab.core.errors import UserError
from servelab.metrics.plain_json import plain
from servelab.reproduce.stats import SeedRuns, over_seeds


@dataclass(frozen=True)
class Step:
    label: str  # the progress line and the key of its CPU time in ``timings_cpu_s``
    run: Callable[[Run], Any]  # the experiment
    key: str | tuple[str, ...] | None = None  # where its value goes in the results (a tuple: nested); None: kept out


@dataclass(frozen=True)
class Variant:
    name: str
    help: str
    sizes: Mapping[str, Any] = field(default_factory=dict)  # fields of the sizes record replaced
    options: Mapping[str, Any] = field(default_factory=dict)  # options replaced


@dataclass(frozen=True)
class ReadmeHooks:
    """What a design adds to ``servelab reproduce all``'s README (all optional)."""

    summarize: Callable[[Any, int], dict] | None = None  # (result, seed) -> numbers kept in README.json
    explain: Callable[[Any, Any, dict], str | None] | None = None  # (full, reduced Claim, run) -> why they differ
    notes: Callable[[dict], list[str]] | None = None  # run -> lines after the design's claims table


@dataclass(frozen=True)
class Reproduction:
    name: str
    sizes: Mapping[str, Any]  # "full" and "reduced" (a design without a reduced size gives the same twice)
    steps: Callable[[Run], Sequence[Step]]  # the experiments, in order, for this run's sizes and options
    write: Callable[[Run], Any]  # plots and report from ``run.results``; returns what the command returns
    start: Callable[[Run], None] | None = None  # fills the results' header (sizes, setting) before the steps
    json_name: str | None = None  # the results JSON, relative to the output folder ("{stem}" is replaced)
    report: str = "{stem}.md"  # the markdown report ``write`` makes, relative to the output folder
    to_json: Callable[[dict], Any] = plain  # results -> what the JSON holds
    variants: tuple[Variant, ...] = ()
    default_seeds: int = 1
    readme: ReadmeHooks = ReadmeHooks()


@dataclass
class Run:
    """One run of a reproduction: the setting every experiment reads, and the results so far."""

    reproduction: Reproduction
    out_dir: Path
    reduced: bool
    seed: int
    sizes: Any
    options: dict[str, Any]
    num_seeds: int
    variant: Variant | None
    say: Callable[[str], None]
    results: dict[str, Any] = field(default_factory=dict)
    _cleanup: ExitStack = field(default_factory=ExitStack, repr=False)

    @property
    def name(self) -> str:
        return self.reproduction.name

    @property
    def stem(self) -> str:
        """The report's file stem: the name, or ``name-variant``."""
        return self.name if self.variant is None else f"{self.name}-{self.variant.name}"

    @property
    def seeds(self) -> range:
        return range(self.seed, self.seed + self.num_seeds)

    def over_seeds(self, fn: Callable[[int], Any]) -> SeedRuns:
        """``fn(seed)`` for every seed of the run (``--seeds``), as ``SeedRuns``."""
        return over_seeds(fn, self.seeds)

    @property
    def report_path(self) -> Path:
        return self.out_dir / self.reproduction.report.format(stem=self.stem)

    def fig_dir(self) -> Path:
        """The folder of the plots (``out_dir/<stem>``), made on first use."""
        path = self.out_dir / self.stem
        path.mkdir(parents=True, exist_ok=True)
        return path

    def on_exit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` when the run ends, however it ends (restore a setting the run changed)."""
        self._cleanup.callback(fn, *args)

    def tmp_dir(self, prefix: str = "") -> Path:
        """A temporary folder removed when the run ends, however it ends (done, error, Ctrl-C, SIGTERM)."""
        tmp = self._cleanup.enter_context(tempfile.TemporaryDirectory(prefix=f"servelab-{self.name}-{prefix}"))
        return Path(tmp)


class Progress:
    """Progress lines with an ETA on stderr: ``[name 3/14] label ...`` then its CPU time.

    The ETA scales the expected CPU time of the steps left by this run's wall seconds per
    expected CPU second so far, so a loaded machine's ETA grows with it. Expected step times
    come from the last results JSON in the output folder (same size), else the registry's
    measured total spread evenly."""

    def __init__(self, name: str, labels: list[str], expected: dict[str, float],
                 say: Callable[[str], None]) -> None:
        self.name, self.labels, self.expected, self.say = name, labels, expected, say
        self.t0 = time.perf_counter()
        self.done_expected = 0.0

    def begin(self, i: int) -> None:
        eta = self.eta(i)
        self.say(f"[{self.name} {i + 1}/{len(self.labels)}] {self.labels[i]} "
                 f"(elapsed {_duration(time.perf_counter() - self.t0)}{', ETA ' + eta if eta else ''})")

    def end(self, i: int, cpu_s: float) -> None:
        self.done_expected += self.expected.get(self.labels[i], 0.0)
        self.say(f"[{self.name} {i + 1}/{len(self.labels)}] {self.labels[i]}: {cpu_s:.1f} s CPU")

    def eta(self, i: int) -> str | None:
        left = sum(self.expected.get(label, 0.0) for label in self.labels[i:])
        if not self.expected or left <= 0:
            return None
        elapsed = time.perf_counter() - self.t0
        rate = elapsed / self.done_expected if self.done_expected > 0 and elapsed > 1 else 1.0
        return "~" + _duration(left * rate)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def run_reproduction(repro: Reproduction, out_dir: Path, *, reduced: bool = False, seed: int = 0,
                     sizes: Any = None, options: Mapping[str, Any] | None = None, num_seeds: int | None = None,
                     variant: str | None = None, progress: bool | Callable[[str], None] = False,
                     expected_cpu_s: float | None = None) -> Any:
    """Run every step of ``repro``, then its ``write``; returns what ``write`` returns.

    ``sizes`` replaces the FULL / REDUCED record (tests use tiny ones); ``progress``: True
    prints progress to stderr, a callable receives the lines; ``expected_cpu_s``: the measured
    total for this size (the registry's), for an ETA before any run of this size was seen."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    chosen = _variant(repro, variant)
    base = sizes if sizes is not None else repro.sizes["reduced" if reduced else "full"]
    say = progress if callable(progress) else ((lambda m: print(m, file=sys.stderr, flush=True)) if progress
                                               else (lambda _m: None))
    run = Run(repro, out_dir, reduced, seed,
              dataclasses.replace(base, **chosen.sizes) if chosen is not None and chosen.sizes else base,
              {**(options or {}), **(chosen.options if chosen is not None else {})},
              num_seeds if num_seeds is not None else repro.default_seeds, chosen, say)
    if run.num_seeds < 1:
        raise UserError(f"--seeds must be >= 1, got {run.num_seeds}")
    partial = out_dir / f"{run.stem}.partial.json"
    run.results["reduced"] = reduced  # which size made the JSON (the next run's ETA reads its timings only then)
    with _interrupts_as_exit(), run._cleanup:
        if repro.start is not None:
            repro.start(run)
        steps = list(repro.steps(run))
        labels = [s.label for s in steps]
        bar = Progress(repro.name, labels, _expected(run, labels, expected_cpu_s), say)
        timings: dict[str, float] = {}
        current = None
        try:
            for i, step in enumerate(steps):
                current = step.label
                bar.begin(i)
                t0 = cpu_time_s()
                value = step.run(run)
                cpu_s = cpu_time_s() - t0
                if step.key is not None:
                    _store(run.results, step.key, value)
                timings[step.label] = cpu_s
                bar.end(i, cpu_s)
                _write_partial(partial, run, timings, labels[:i + 1], None)
            current = "writing the report"
            run.results["timings_cpu_s"] = timings
            result = repro.write(run)
            if repro.json_name is not None:
                path = out_dir / repro.json_name.format(stem=run.stem)
                path.parent.mkdir(parents=True, exist_ok=True)
                write_results_json(path, repro.to_json(run.results))
        except BaseException as err:
            _write_partial(partial, run, timings, [x for x in labels if x in timings], current)
            how = "interrupted" if isinstance(err, (KeyboardInterrupt, SystemExit)) else "failed"
            say(f"[{repro.name}] {how} during {current}; results so far in {partial}")
            raise
    partial.unlink(missing_ok=True)
    return result


def _variant(repro: Reproduction, name: str | None) -> Variant | None:
    if name is None:
        return None
    for v in repro.variants:
        if v.name == name:
            return v
    known = ", ".join(v.name for v in repro.variants) or "none"
    raise UserError(f"--variant: {repro.name} has no variant {name!r} (known: {known})")


def _store(results: dict, key: str | tuple[str, ...], value: Any) -> None:
    path = (key,) if isinstance(key, str) else key
    for part in path[:-1]:
        results = results.setdefault(part, {})
    results[path[-1]] = value


def cpu_time_s() -> float:
    """CPU seconds of this process and of its children that have ended (a step that spreads its
    runs over worker processes is charged their CPU once it has waited for them)."""
    import resource

    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + ch.ru_utime + ch.ru_stime


def _expected(run: Run, labels: list[str], total_cpu_s: float | None) -> dict[str, float]:
    """Expected CPU seconds per step label: the last run's timings of this size in the output
    folder, else ``total_cpu_s`` spread over the steps; empty when neither is known."""
    if run.reproduction.json_name is not None:
        last = run.out_dir / run.reproduction.json_name.format(stem=run.stem)
        try:
            data = json.loads(last.read_text())
        except (OSError, ValueError):
            data = None
        same_size = isinstance(data, dict) and data.get("reduced") == run.reduced
        if same_size and isinstance(data.get("timings_cpu_s"), dict):
            known = {k: float(v) for k, v in data["timings_cpu_s"].items() if k in labels and v is not None}
            if known:
                mean = sum(known.values()) / len(known)
                return {label: known.get(label, mean) for label in labels}
    if total_cpu_s:
        return {label: total_cpu_s / len(labels) for label in labels}
    return {}


def _write_partial(path: Path, run: Run, timings: dict, done: list[str], interrupted_at: str | None) -> None:
    """The results so far; a failure to write them never hides the run's own error."""
    payload = {"reproduction": run.name, "variant": run.variant.name if run.variant else None,
               "reduced": run.reduced, "seed": run.seed, "steps_done": done, "interrupted_at": interrupted_at,
               "timings_cpu_s": timings, "results": run.results}
    try:
        path.write_text(json.dumps(plain(payload), indent=1, default=json_default))
    except (OSError, TypeError, ValueError) as err:
        run.say(f"[{run.name}] could not write partial results to {path}: {err}")


def write_results_json(path: Path, data) -> None:
    """A reproduction's results, compact (no indentation), measured floats to 8 significant
    digits: indented, the full KunServe run's JSON was 3.1 MB against 1.6 MB compact, and with
    its gap steps 2.26 MB at 17 digits, over the 2 MB a tracked file may have. Reports print 4
    digits at most. Rates (any key naming one) are inputs and stay exact: a report prints them
    whole so that a rerun uses the same arrivals."""
    plain = json.loads(json.dumps(data, default=json_default))
    path.write_text(json.dumps(_rounded(plain), separators=(",", ":")))


def _rounded(value: Any, exact: bool = False) -> Any:
    if isinstance(value, float) and not exact:
        return float(f"{value:.8g}")
    if isinstance(value, dict):
        return {k: _rounded(v, exact or "rate" in k) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v, exact) for v in value]
    return value


def json_default(value: Any) -> Any:
    """What ``json.dumps`` cannot write itself: numpy arrays and scalars, dataclasses, paths."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


class _interrupts_as_exit:
    """SIGTERM raises ``SystemExit(143)`` while a run is under way (main thread only), so the
    ``with`` blocks and the partial results are handled as on Ctrl-C; restored afterwards."""

    def __enter__(self):
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, _raise_exit)
        return self

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


def _raise_exit(signum, frame) -> None:
    raise SystemExit(128 + signum)
