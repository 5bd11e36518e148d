"""Bad-input case classes: a strategy, the call it feeds, and how an outcome is judged.

Each generated case ends in one of three outcomes:

* ``clean error``: a ``UserError`` whose message is one line and names the input (the
  spec string, the file's path, the parameter), and the input was indeed invalid where the
  class can tell;
* ``correct result``: the call returned, and what it returned matches what the input says
  (an independent reading of the generated values, or the class's invariants);
* ``other``: anything else: another exception, a hang (over ``TIME_LIMIT_S``), a vague
  error, a valid input rejected, or a result that disagrees with the input.

The tests assert that no case is ``other``; ``scripts/reliability_report.py`` counts them.
"""

from __future__ import annotations

import collections
import contextlib
import math
import signal
import tempfile
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from reliability import strategies as gen
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from reliability.tiny_data import tiny_data_dir

from servelab.core.errors import UserError
from servelab.core.limits import MAX_DURATION_S, MAX_TOKENS

CLEAN, CORRECT, OTHER = "clean error", "correct result", "other"
TIME_LIMIT_S = 10


@dataclass(frozen=True)
class Outcome:
    kind: str
    detail: str = ""


@dataclass(frozen=True)
class CaseClass:
    name: str
    description: str
    strategy: st.SearchStrategy
    run: Callable[[Any], Outcome]


class Hang(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: int):
    """SIGALRM after ``seconds``: a case that runs without bound becomes an outcome, not a stuck run."""
    def alarm(signum, frame):
        raise Hang(f"no result after {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def judge(call: Callable[[], Any], names_input: Callable[[str], bool], verify: Callable[[Any], str | None],
          input_is_valid: bool | None = None) -> Outcome:
    """Run ``call`` and classify it. ``verify(result)`` returns None when the result is right,
    else what is wrong; ``input_is_valid`` (when the class knows) turns a rejected valid
    input or an accepted invalid one into ``other``."""
    try:
        with time_limit(TIME_LIMIT_S), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = call()
    except UserError as err:
        message = str(err)
        if "\n" in message or not names_input(message):
            return Outcome(OTHER, f"vague error: {message!r}")
        if input_is_valid:
            return Outcome(OTHER, f"valid input rejected: {message!r}")
        return Outcome(CLEAN, message)
    except Exception as err:  # noqa: BLE001 - classifying every exception is the point
        where = traceback.extract_tb(err.__traceback__)[-1]
        return Outcome(OTHER, f"{type(err).__name__}: {err} (at {Path(where.filename).name}:{where.lineno})")
    if input_is_valid is False:
        return Outcome(OTHER, f"invalid input accepted: {result!r:.200}")
    problem = verify(result)
    return Outcome(OTHER, f"wrong result: {problem}") if problem else Outcome(CORRECT)


# ---------------------------------------------------------------- SLO strings
def _expected_slo(text: str) -> dict[str, float] | None:
    """The SLO rules read independently: names once each, finite durations > 0 (a bare number is
    seconds, or a number then s / ms), not empty."""
    if not text.strip() or text.strip().lower() == "none":
        return None
    values: dict[str, float] = {}
    for item in text.split(","):
        name, colon, value = item.partition(":")
        name = name.strip().lower()
        if not colon or name not in ("ttft", "tpot", "tbt", "e2el") or f"{name}_s" in values:
            return None
        value, scale = value.strip(), 1.0
        for unit, factor in (("ms", 1e-3), ("s", 1.0)):
            if value.lower().endswith(unit) and not value.lower().endswith(("ns", "us")) and value[:-len(unit)]:
                value, scale = value[:-len(unit)], factor
                break
        try:
            seconds = float(value) * scale
        except ValueError:
            return None
        if not 0 < seconds < math.inf:
            return None
        values[f"{name}_s"] = seconds
    return values


def run_slo(text: str) -> Outcome:
    from servelab.workloads.slo import parse_slo

    expected = _expected_slo(text)

    def verify(slo) -> str | None:
        got = {k: getattr(slo, k) for k in ("ttft_s", "tpot_s", "tbt_s", "e2el_s") if getattr(slo, k) is not None}
        return None if got == expected else f"{got} != {expected}"

    return judge(lambda: parse_slo(text, "--slo"), lambda m: "--slo" in m, verify, expected is not None)


# ---------------------------------------------------------------- workload specs
def run_workload_spec(spec: str) -> Outcome:
    from servelab.workloads.spec import SYNTHETIC, parse_spec, parse_workload

    def verify(workload) -> str | None:
        times = [s.arrival_time_s for s in workload]
        if not workload:
            return "empty workload"
        if [s.request_id for s in workload] != list(range(len(workload))):
            return "ids are not 0..n-1"
        if times[0] != 0 or any(b < a for a, b in zip(times, times[1:])) or not times[-1] <= MAX_DURATION_S:
            return f"arrival times not sorted from 0 within the maximum span: {times[:5]}..."
        for s in workload:
            for n in (s.num_prompt_tokens, s.num_output_tokens):
                if type(n) is not int or not 1 <= n <= MAX_TOKENS:
                    return f"request {s.request_id} has length {n!r}"
        parsed = parse_spec(spec)
        if parsed.source in SYNTHETIC and len(workload) != int(parsed.get("n")):
            return f"{len(workload)} requests, spec asks for n={parsed.get('n')}"
        prompt = parsed.get("prompt") or ""
        if prompt.startswith("fixed(") and parsed.get("max_total") is None:
            if {s.num_prompt_tokens for s in workload} != {int(prompt[6:-1])}:
                return f"prompt lengths differ from {prompt}"
        if parsed.get("slo") is not None and parsed.get("offline") is None:
            if {s.slo for s in workload} != {_slo_of(parsed.get("slo"))}:
                return "requests do not carry the spec's SLO"
        return None

    def names_input(message: str) -> bool:
        from servelab.workloads.spec import quoted

        return quoted(spec) in message or message.startswith(str(tiny_data_dir())) or message.startswith("/")

    return judge(lambda: parse_workload(spec, tiny_data_dir(), 0), names_input, verify)


def _slo_of(text: str):
    from servelab.workloads.slo import parse_slo

    return parse_slo(text)


# ---------------------------------------------------------------- policy specs
_BOOL_WORDS = {"true": True, "yes": True, "1": True, "on": True, "false": False, "no": False, "0": False, "off": False}


def _expected_param(text: str, hint: Any) -> Any:
    """The text read as the annotation says, independently of the registry; raises if unreadable."""
    import typing

    text = text.strip()
    args = typing.get_args(hint)
    if args and type(None) in args:
        if text.lower() in ("none", "null", ""):
            return None
        hint = next(a for a in args if a is not type(None))
    if typing.get_origin(hint) is tuple:
        return tuple(_expected_param(t, typing.get_args(hint)[0]) for t in text.replace(";", ",").split(",") if t)
    if hint is bool:
        return _BOOL_WORDS[text.lower()]
    if hint is int:
        number = float(text)
        if not number.is_integer():
            raise ValueError(text)
        return int(number)
    if hint is float:
        number = float(text)
        if not math.isfinite(number):
            raise ValueError(text)
        return number
    return text


def run_policy_spec(spec: str) -> Outcome:
    from servelab import api
    from servelab.core.policy import POLICIES, ROUTERS
    from servelab.core.registry import parse_name_params

    hardware = api.HardwareChoice(num_instances=2)

    def build():
        cluster = api.check_policy(spec, hardware)
        configs = [getattr(POLICIES.create(g.policy, dict(g.policy_params)), "config", None) for g in cluster.groups]
        configs.append(getattr(ROUTERS.create(cluster.router, dict(cluster.router_params)), "config", None))
        return cluster, [c for c in configs if c is not None]

    def verify(built) -> str | None:
        cluster, configs = built
        name, params = parse_name_params(spec)
        fields = gen.policy_fields(name)
        for key, text in params.items():
            try:
                want = _expected_param(text, fields[key])
            except (KeyError, ValueError, IndexError) as err:
                return f"{key}={text!r} accepted but unreadable ({type(err).__name__})"
            if key == "num_prefill":
                got = sum(g.count for g in cluster.groups if g.role == "prefill")
            else:
                holders = [c for c in configs if hasattr(c, key)]
                if not holders:
                    return f"{key}={text!r} accepted but no config holds it"
                got = getattr(holders[0], key)
            if got != want and not (hasattr(got, "value") and got.value == want):
                return f"{key}={text!r} became {got!r}, expected {want!r}"
        return None

    def names_input(message: str) -> bool:
        name = spec.partition(":")[0].strip()
        return repr(spec) in message or (bool(name) and name in message) or "policy ''" in message

    return judge(build, names_input, verify)


# ---------------------------------------------------------------- files
def _write(case: gen.FileCase) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="servelab-case-", dir=tiny_data_dir()))
    path = folder / f"input{case.suffix}"
    path.write_bytes(case.data)
    return path


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


def _verify_trace(expected: list[tuple]):
    def verify(specs) -> str | None:
        got = [(s.arrival_time_s, s.num_prompt_tokens, s.num_output_tokens) for s in specs]
        if len(got) != len(expected):
            return f"{len(got)} requests, the file has {len(expected)}"
        for i, (g, e) in enumerate(zip(got, expected)):
            if not _close(g[0], e[0]) or g[1:] != tuple(e[1:3]):
                return f"request {i} is {g}, the file says {e[:3]}"
        if len(expected[0]) > 3 and [s.prefix_block_ids for s in specs] != [e[3] for e in expected]:
            return "hash_ids differ from the file"
        return None

    return verify


def _verify_table(expected: list[tuple]):
    def verify(table) -> str | None:
        got = list(zip(table.num_prompt_tokens.tolist(), table.num_output_tokens.tolist()))
        return None if got == [tuple(e) for e in expected] else f"{got} != {expected}"

    return verify


def _verify_gsm8k(expected: list[str]):
    def verify(table) -> str | None:
        if list(table.prompt_texts) != expected:
            return "prompt texts differ from the questions"
        if len(table) != len(expected) or min(table.num_output_tokens) < 1 or min(table.num_prompt_tokens) < 1:
            return "lengths missing or < 1"
        return None

    return verify


def _verify_cost_model(expected: tuple):
    coefficients, kv_bytes, meta = expected

    def verify(model) -> str | None:
        for name, value in coefficients.items():
            if getattr(model, name) != value:
                return f"{name} is {getattr(model, name)!r}, the file says {value!r}"
        if model.kv_bytes_per_token != kv_bytes or model.meta != meta:
            return "kv_bytes_per_token or meta differ from the file"
        return None

    return verify


def _loaders() -> dict[str, tuple[Callable, Callable]]:
    from servelab.costmodel.linear import LinearCostModel
    from servelab.workloads import load_arxiv_lengths, load_azure_llm, load_burstgpt, load_gsm8k, load_mooncake

    return {"azure": (load_azure_llm, _verify_trace), "mooncake": (load_mooncake, _verify_trace),
            "burstgpt": (load_burstgpt, _verify_trace), "arxiv": (load_arxiv_lengths, _verify_table),
            "gsm8k": (load_gsm8k, _verify_gsm8k), "cost_model": (LinearCostModel.load, _verify_cost_model)}


def run_file(case: gen.FileCase) -> Outcome:
    load, verifier = _loaders()[case.kind]
    path = _write(case)
    try:
        verify = verifier(case.expected) if case.expected is not None else (lambda result: None)
        return judge(lambda: load(path), lambda m: str(path) in m, verify, case.expected is not None)
    finally:
        path.unlink()
        path.parent.rmdir()


CASE_CLASSES = [
    CaseClass("slo", "SLO strings (--slo, slo=)", gen.slo_strings(), run_slo),
    CaseClass("workload_spec", "workload spec strings", gen.workload_specs(), run_workload_spec),
    CaseClass("policy_spec", "policy spec strings (policies and presets, 2 instances)", gen.policy_specs(),
              run_policy_spec),
    CaseClass("azure_rows", "Azure LLM 2023 CSV files", gen.azure_files(), run_file),
    CaseClass("mooncake_rows", "Mooncake JSONL files", gen.mooncake_files(), run_file),
    CaseClass("burstgpt_rows", "BurstGPT CSV files", gen.burstgpt_files(), run_file),
    CaseClass("arxiv_rows", "arXiv lengths CSV files", gen.arxiv_files(), run_file),
    CaseClass("gsm8k_rows", "GSM8K JSONL files", gen.gsm8k_files(), run_file),
    CaseClass("cost_model_json", "linear cost-model JSON files", gen.cost_model_files(), run_file),
]


def tally(case_class: CaseClass, num_examples: int, random_seed: int) -> tuple[collections.Counter, list[tuple]]:
    """Run ``num_examples`` generated cases with a fixed seed; returns the outcome counts and
    the ``other`` cases as (example, detail). Only the generate phase runs: every example is
    counted once, none is replayed or shrunk."""
    counts: collections.Counter = collections.Counter()
    others: list[tuple] = []

    @seed(random_seed)
    @settings(max_examples=num_examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case_class.strategy)
    def run(example):
        outcome = case_class.run(example)
        counts[outcome.kind] += 1
        if outcome.kind == OTHER:
            others.append((example, outcome.detail))

    run()
    return counts, others
