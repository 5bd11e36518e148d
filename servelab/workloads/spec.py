"""Compact workload spec strings for the CLI: ``parse_workload(spec, data_dir, seed)``.

Grammar::

    spec    := SOURCE [":" option ("," option)*]
    option  := KEY "=" VALUE

Commas inside parentheses do not split options, and a comma-separated piece without
``=`` continues the previous value, so ``slo=ttft:2,tpot:0.1`` and
``prompt=uniform(32,512)`` are single options. Times are seconds, rates requests/second.

Sources and their keys:

* Traces, replayed: ``azure-conv``, ``azure-code``, ``mooncake``, ``burstgpt``.
  Keys: ``path=FILE`` (default: the file under ``data_dir/traces``; required for
  burstgpt unless ``data_dir/traces/burstgpt.csv`` exists), ``window=START-END`` (keep
  arrivals in [START, END) s, re-based to 0), ``n=N`` (first N after the window),
  ``rate=R`` (rescale to mean rate R) or ``scale=F`` (multiply the rate by F, i.e. divide
  every gap by F). burstgpt also takes ``model=GPT-4``, ``log=Conversation log``,
  ``zero=skip|clamp|error`` (rows with 0 tokens; default skip, with a warning).
  Order: window, then n, then rate/scale.
* Synthetic arrivals: ``poisson:rate=R,n=N``, ``gamma:rate=R,cv=C,n=N`` (cv of the
  gaps; 1 = Poisson), ``burst:n=N`` (all at time 0). Lengths come from either
  ``prompt=DIST,output=DIST`` or ``lengths=SOURCE`` (default ``lengths=alpaca``: chat-like
  lengths); ``max_total=T`` caps prompt + output for ``prompt=/output=`` by truncating the prompt.
* Length datasets: ``gsm8k``, ``arxiv`` with ``n=N`` (default: every row), ``rate=R``
  (Poisson; with ``cv=C`` gamma; without a rate all arrive at 0) and ``path=FILE``.
  Rows are drawn without replacement while n <= rows, with replacement beyond.

``DIST``: ``fixed(T)``, ``uniform(LO,HI)`` (inclusive), ``exp(MEAN[,MAX])``,
``lognormal(MEDIAN,SIGMA[,MAX])``; lengths are clipped to [1, MAX].
``SOURCE``: ``alpaca``, ``longbench`` (presets, see ``lengths.py``), ``arxiv``,
``gsm8k``, ``azure-conv``, ``azure-code``, ``mooncake`` (pairs sampled jointly from the
data), or ``mix(SOURCE:WEIGHT,...)``, e.g. ``mix(alpaca:0.7,longbench:0.3)``.

Keys valid for every source: ``slo=ttft:S,tpot:S,tbt:S`` (any subset, each name once),
``offline=F`` (fraction of requests marked offline; they get no SLO),
``priority=P:W,P:W`` (priority values drawn with these weights, each value once).

Every number must be finite; ``n=`` is at most ``MAX_NUM_REQUESTS`` and token counts at
most ``MAX_TOKENS`` (``servelab.core.limits``). A key given twice is an error. Every error is
a ``WorkloadError`` (a ``UserError``) that quotes the spec or names the file and line.

Examples: ``azure-conv:rate=2.0,window=0-600,n=1000``,
``gamma:rate=5,cv=3,n=1000,prompt=uniform(32,512),output=exp(200)``,
``burst:n=256,prompt=fixed(128),output=uniform(1,1024)``, ``gsm8k:rate=4,n=500``,
``poisson:rate=2,n=500,lengths=mix(alpaca:0.7,longbench:0.3),slo=ttft:2,tpot:0.1``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servelab.core.errors import UserError, shown
from servelab.core.limits import MAX_NUM_REQUESTS, MAX_PARAM_INT, MAX_TOKENS
from servelab.core.request import RequestSpec
from servelab.workloads import arrivals as arr
from servelab.workloads import lengths as ln
from servelab.workloads._parse import WorkloadError, WorkloadFileError
from servelab.workloads.slo import parse_slo
from servelab.workloads import parsed_files
from servelab.workloads.traces import ZERO_TOKEN_POLICIES, load_burstgpt
from servelab.workloads.workload import (RequestAttrs, Workload, assign_attrs, build_workload, head, scale_rate,
                                         scale_to_rate, time_window)

DEFAULT_FILES = {
    "azure-conv": "traces/azure_llm_2023_conv.csv",
    "azure-code": "traces/azure_llm_2023_code.csv",
    "mooncake": "traces/mooncake_conversation.jsonl",
    "burstgpt": "traces/burstgpt.csv",
    "arxiv": "datasets/arxiv_summarization_lengths.csv",
    "gsm8k": "datasets/gsm8k_train.jsonl",
}
TRACES = ("azure-conv", "azure-code", "mooncake", "burstgpt")
SYNTHETIC = ("poisson", "gamma", "burst")
DEFAULT_SYNTHETIC_LENGTHS = "alpaca"  # a synthetic workload without lengths gets chat-like ones
DATASETS = ("gsm8k", "arxiv")
_COMMON_KEYS = ("slo", "offline", "priority")
_TRACE_KEYS = ("path", "window", "n", "rate", "scale")
_LENGTH_KEYS = ("prompt", "output", "lengths", "max_total")
VALID_KEYS: dict[str, tuple[str, ...]] = {
    **{name: _TRACE_KEYS + _COMMON_KEYS for name in TRACES},
    "burstgpt": _TRACE_KEYS + ("model", "log", "zero") + _COMMON_KEYS,
    "poisson": ("rate", "n") + _LENGTH_KEYS + _COMMON_KEYS,
    "gamma": ("rate", "cv", "n") + _LENGTH_KEYS + _COMMON_KEYS,
    "burst": ("n",) + _LENGTH_KEYS + _COMMON_KEYS,
    **{name: ("path", "n", "rate", "cv") + _COMMON_KEYS for name in DATASETS},
}


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A parsed, not yet loaded, spec; ``str()`` gives back a string that parses to it."""

    source: str
    options: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        if not self.options:
            return self.source
        return self.source + ":" + ",".join(f"{k}={v}" for k, v in self.options)

    def get(self, key: str) -> str | None:
        return dict(self.options).get(key)


def quoted(spec: str) -> str:
    """The spec as an error quotes it: in full up to 200 characters (a generated 12 KB spec
    would flood the one line an error gets)."""
    return shown(spec, 200)


def parse_spec(spec: str) -> WorkloadSpec:
    """Split and check a spec string (names and keys only; values are checked when built)."""
    source, _, rest = spec.strip().partition(":")
    source = source.strip()
    if source not in VALID_KEYS:
        raise WorkloadError(f"workload spec {quoted(spec)}: unknown source {source!r}; valid: {sorted(VALID_KEYS)}")
    options: list[list[str]] = []
    try:
        pieces = split_top_level(rest) if rest.strip() else []
    except WorkloadError as err:
        raise WorkloadError(f"workload spec {quoted(spec)}: {err}") from None
    for piece in pieces:
        key, eq, value = piece.partition("=")
        if eq and "(" not in key:
            options.append([key.strip(), value.strip()])
        elif options:
            options[-1][1] += "," + piece.strip()
        else:
            raise WorkloadError(f"workload spec {quoted(spec)}: expected KEY=VALUE, got {piece!r}")
    keys = [k for k, _ in options]
    for key in keys:
        if key not in VALID_KEYS[source]:
            raise WorkloadError(f"workload spec {quoted(spec)}: unknown key {key!r} for {source}; "
                                f"valid: {list(VALID_KEYS[source])}")
        if keys.count(key) > 1:
            raise WorkloadError(f"workload spec {quoted(spec)}: key {key!r} given twice")
    return WorkloadSpec(source, tuple((k, v) for k, v in options))


def split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    pieces, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            raise WorkloadError(f"unbalanced ')' in {shown(text, 80)}")
        if char == "," and depth == 0:
            pieces.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise WorkloadError(f"unbalanced '(' in {shown(text, 80)}")
    return pieces + [text[start:]]


def parse_workload(spec: str, data_dir: Path | str, seed: int) -> list[RequestSpec]:
    """Parse ``spec`` and build its workload; bad specs raise ``WorkloadError``.

    Errors about a file already name it (``path:line: ...``); any other ``UserError`` from
    building (a value, a length distribution, an arrival process) gets the spec quoted in front.
    """
    parsed = parse_spec(spec)
    if not 0 <= seed <= 2**63 - 1:
        raise WorkloadError(f"seed must be in [0, 2**63 - 1], got {seed}")
    try:
        return build_spec(parsed, Path(data_dir), np.random.default_rng(seed))
    except WorkloadFileError:
        raise
    except UserError as err:
        raise WorkloadError(f"workload spec {quoted(spec)}: {err}") from None


def build_spec(spec: WorkloadSpec, data_dir: Path, rng: np.random.Generator) -> Workload:
    workload_rng, attr_rng = rng.spawn(2)
    if spec.source in TRACES:
        workload = _build_trace(spec, data_dir)
    elif spec.source in SYNTHETIC:
        workload = _build_synthetic(spec, data_dir, workload_rng)
    else:
        workload = _build_dataset(spec, data_dir, workload_rng)
    attrs = _parse_attrs(spec)
    return assign_attrs(workload, attrs, attr_rng) if not attrs.is_default else workload


def _build_trace(spec: WorkloadSpec, data_dir: Path) -> Workload:
    workload = load_trace(spec.source, _path(spec, data_dir), spec)
    if (window := spec.get("window")) is not None:
        start_s, end_s = _window(window)
        workload = time_window(workload, start_s, end_s)
    if (n := spec.get("n")) is not None:
        workload = head(workload, _positive_int("n", n, MAX_NUM_REQUESTS))
    if spec.get("rate") is not None and spec.get("scale") is not None:
        raise WorkloadError("give rate= or scale=, not both")
    if (rate := spec.get("rate")) is not None:
        workload = scale_to_rate(workload, _positive_float("rate", rate))
    if (scale := spec.get("scale")) is not None:
        workload = scale_rate(workload, _positive_float("scale", scale))
    if not workload:
        raise WorkloadError("no requests left after window= and n=")
    return workload


def load_trace(source: str, path: Path, spec: WorkloadSpec | None = None) -> Workload:
    if source != "burstgpt":
        return parsed_files.trace(source, path)  # parsed once per process
    zero = spec.get("zero") if spec is not None and spec.get("zero") is not None else "skip"
    if zero not in ZERO_TOKEN_POLICIES:
        raise WorkloadError(f"zero= must be one of {ZERO_TOKEN_POLICIES}, got {zero!r}")
    return load_burstgpt(path, zero_tokens=zero, model=spec.get("model") if spec else None,
                         log_type=spec.get("log") if spec else None)


def _build_synthetic(spec: WorkloadSpec, data_dir: Path, rng: np.random.Generator) -> Workload:
    n = _positive_int("n", _required(spec, "n"), MAX_NUM_REQUESTS)
    if spec.source == "poisson":
        process = arr.PoissonArrivals(_positive_float("rate", _required(spec, "rate")))
    elif spec.source == "gamma":
        process = arr.GammaArrivals(_positive_float("rate", _required(spec, "rate")),
                                    _float("cv", _required(spec, "cv")))
    else:
        process = arr.BurstArrivals()
    return build_workload(process, _length_source(spec, data_dir), n, rng)


def _build_dataset(spec: WorkloadSpec, data_dir: Path, rng: np.random.Generator) -> Workload:
    table = parsed_files.length_dataset(spec.source, _path(spec, data_dir))
    n = _positive_int("n", spec.get("n"), MAX_NUM_REQUESTS) if spec.get("n") is not None else len(table)
    rate, cv = spec.get("rate"), spec.get("cv")
    if cv is not None and rate is None:
        raise WorkloadError("cv= needs rate=")
    if rate is None:
        process = arr.BurstArrivals()
    elif cv is None:
        process = arr.PoissonArrivals(_positive_float("rate", rate))
    else:
        process = arr.GammaArrivals(_positive_float("rate", rate), _float("cv", cv))
    return build_workload(process, ln.EmpiricalLengths(table), n, rng)


def _length_source(spec: WorkloadSpec, data_dir: Path) -> ln.LengthSource:
    prompt, output, named = spec.get("prompt"), spec.get("output"), spec.get("lengths")
    if named is not None:
        if prompt is not None or output is not None or spec.get("max_total") is not None:
            raise WorkloadError("give lengths= or prompt=/output=, not both")
        return parse_length_source(named, data_dir)
    if prompt is None and output is None:
        return parse_length_source(DEFAULT_SYNTHETIC_LENGTHS, data_dir)
    if prompt is None or output is None:
        raise WorkloadError("needs both prompt=DIST and output=DIST (or lengths=SOURCE, or neither: "
                            f"lengths={DEFAULT_SYNTHETIC_LENGTHS})")
    max_total = spec.get("max_total")
    return ln.IndependentLengths(parse_length_dist(prompt), parse_length_dist(output),
                                 _positive_int("max_total", max_total, MAX_TOKENS) if max_total is not None else None)


_CALL = re.compile(r"^\s*([a-z][a-z0-9_-]*)\s*\((.*)\)\s*$", re.DOTALL)


def parse_length_dist(text: str) -> ln.LengthDist:
    """``uniform(32,512)`` -> ``Uniform(32, 512)``; the inverse of ``str(dist)``."""
    match = _CALL.match(text)
    if not match:
        raise WorkloadError(f"length distribution {text!r}: expected NAME(NUMBERS), one of {sorted(ln.LENGTH_DISTS)}")
    name, body = match.groups()
    try:
        numbers = [float(x) for x in body.split(",")] if body.strip() else []
    except ValueError:
        raise WorkloadError(f"length distribution {text!r}: expected comma-separated numbers") from None
    try:
        return ln.make_length_dist(name, numbers)
    except UserError as err:
        raise WorkloadError(f"length distribution {text!r}: {err}") from None


LENGTH_SOURCE_NAMES = tuple(ln.PRESETS) + DATASETS + ("azure-conv", "azure-code", "mooncake")


MAX_MIX_DEPTH = 8  # mix(mix(...)) this deep is already one flat mix written the long way


def parse_length_source(text: str, data_dir: Path, depth: int = 0) -> ln.LengthSource:
    """A preset, a dataset/trace name (sampled jointly), or ``mix(SOURCE:WEIGHT,...)``; mixes
    nest at most ``MAX_MIX_DEPTH`` deep (deeper, Python's recursion limit would be the error)."""
    text = text.strip()
    match = _CALL.match(text)
    if match and match.group(1) == "mix":
        if depth >= MAX_MIX_DEPTH:
            raise WorkloadError(f"mix(...) nested more than {MAX_MIX_DEPTH} deep; a mixture of mixtures is one "
                                "flat mix(SOURCE:WEIGHT,...) with the weights multiplied out")
        components, weights = [], []
        for piece in split_top_level(match.group(2)):
            name, colon, weight = piece.rpartition(":")
            if not colon:
                raise WorkloadError(f"mix component {piece!r}: expected SOURCE:WEIGHT")
            components.append(parse_length_source(name, data_dir, depth + 1))
            weights.append(_float("mix weight", weight))
        return ln.MixtureLengths(tuple(components), tuple(weights))
    if text in ln.PRESETS:
        return ln.PRESETS[text]()
    if text in DATASETS:
        return ln.EmpiricalLengths(parsed_files.length_dataset(text, data_dir / DEFAULT_FILES[text]))
    if text in ("azure-conv", "azure-code", "mooncake"):
        return ln.EmpiricalLengths(parsed_files.trace_lengths(text, data_dir / DEFAULT_FILES[text]))
    raise WorkloadError(f"unknown length source {text!r}; valid: {list(LENGTH_SOURCE_NAMES)} or mix(SOURCE:WEIGHT,...)")


def _parse_attrs(spec: WorkloadSpec) -> RequestAttrs:
    slo = parse_slo(text, "slo=") if (text := spec.get("slo")) is not None else None
    offline = _float("offline", spec.get("offline")) if spec.get("offline") is not None else 0.0
    priorities = ()
    if (text := spec.get("priority")) is not None:
        priorities = tuple((_int("priority", p, -MAX_PARAM_INT, MAX_PARAM_INT), _float("priority weight", w))
                           for p, w in _pairs("priority", text))
    return RequestAttrs(slo, offline, priorities)


def _pairs(key: str, text: str) -> list[tuple[str, str]]:
    pairs = []
    for piece in text.split(","):
        name, colon, value = piece.partition(":")
        if not colon:
            raise WorkloadError(f"{key}= expects NAME:VALUE pairs, got {piece!r}")
        pairs.append((name.strip(), value.strip()))
    return pairs


def _path(spec: WorkloadSpec, data_dir: Path) -> Path:
    if (path := spec.get("path")) is not None:
        if not path.strip():  # Path("") is ".", which would be reported as "not a regular file"
            raise WorkloadError("path= is empty: give a file, or leave path= out for the default "
                                f"{data_dir / DEFAULT_FILES[spec.source]}" if spec.source in DEFAULT_FILES
                                else "path= is empty: give a file")
        return Path(path)
    path = data_dir / DEFAULT_FILES[spec.source]
    if not path.is_file():
        raise WorkloadError(f"{path}: no such file (pass path=FILE)")
    return path


_NUMBER = r"\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*"
_WINDOW = re.compile(_NUMBER + "-" + _NUMBER)


def _window(text: str) -> tuple[float, float]:
    """``START-END`` in seconds from the trace's first arrival, 0 <= START < END."""
    match = _WINDOW.fullmatch(text)
    if not match:
        raise WorkloadError(f"window= expects START-END in seconds (e.g. 0-600), got {text!r}")
    start_s, end_s = float(match.group(1)), float(match.group(2))
    if not 0 <= start_s < end_s < np.inf:
        raise WorkloadError(f"window={text}: needs 0 <= START < END in finite seconds from the first arrival, "
                            f"got START {start_s:g} and END {end_s:g}")
    return start_s, end_s


def _required(spec: WorkloadSpec, key: str) -> str:
    if (value := spec.get(key)) is None:
        raise WorkloadError(f"{spec.source} needs {key}=")
    return value


def _float(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise WorkloadError(f"{name} must be a number, got {text!r:.40}") from None
    if not np.isfinite(value):
        raise WorkloadError(f"{name} must be a finite number, got {text!r:.40}")
    return value


def _positive_float(name: str, text: str) -> float:
    value = _float(name, text)
    if not value > 0:
        raise WorkloadError(f"{name} must be > 0, got {text!r}")
    return value


def _int(name: str, text: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise WorkloadError(f"{name} must be an integer, got {text!r:.40}") from None
    if not low <= value <= high:
        raise WorkloadError(f"{name} must be in [{low:,}, {high:,}], got {text!r:.40}")
    return value


def _positive_int(name: str, text: str, high: int) -> int:
    return _int(name, text, 1, high)
