"""Hypothesis strategies that generate user input, mostly valid with a few bad parts.

Shared by ``tests/reliability`` and ``scripts/reliability_report.py``. Every generator
starts from a valid input and applies zero to two mutations drawn from menus of known-bad
values (a negative count, ``nan``, a JSON ``true`` where a number belongs, a 10^23-token
cell, a Latin-1 byte, a repeated key...), so both outcomes a case may have, the clean error
and the correct result, are exercised. File generators also return what a correct loader
must give (``FileCase.expected``), computed from the values they wrote, or None when they
wrote something invalid. Sizes stay small: a case runs in milliseconds.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import typing
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from reliability.tiny_data import odd_paths, tiny_data_dir

BAD = object()  # a menu value that is not valid


@dataclass(frozen=True)
class FileCase:
    """A generated file: its bytes, and what a correct loader returns (None: must be an error)."""

    kind: str
    suffix: str
    data: bytes
    expected: Any

    def __repr__(self) -> str:  # hypothesis prints failing examples with this
        return f"FileCase({self.kind}, expected={'error' if self.expected is None else 'ok'}, data={self.data!r:.300})"


def _junk(max_size: int = 12) -> st.SearchStrategy[str]:
    return st.text(max_size=max_size)


# ---------------------------------------------------------------- SLO strings
SLO_NAMES = ["ttft", "tpot", "tbt", "TTFT", " tpot "]
GOOD_SECONDS = ["2", "0.1", "1e-3", " 3 ", "250"]
BAD_SECONDS = ["0", "-1", "nan", "inf", "-inf", "abc", "", "1e400", "2s"]


def slo_item() -> st.SearchStrategy[str]:
    good = st.tuples(st.sampled_from(SLO_NAMES), st.sampled_from(GOOD_SECONDS)).map(":".join)
    bad = st.one_of(st.tuples(st.sampled_from(SLO_NAMES), st.sampled_from(BAD_SECONDS)).map(":".join),
                    st.sampled_from(["e2el:2", "ttft", "ttft=2", "", ":", "ttft:2:3", "latency:1"]), _junk(6))
    return st.one_of(good, good, good, bad)


@st.composite
def slo_strings(draw) -> str:
    """Distinct names with good values, then up to two items replaced by bad ones or repeated."""
    names = draw(st.lists(st.sampled_from(["ttft", "tpot", "tbt"]), min_size=1, max_size=3, unique=True))
    items = [f"{draw(st.sampled_from([n, n.upper(), f' {n} ']))}:{draw(st.sampled_from(GOOD_SECONDS))}" for n in names]
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        kind = draw(st.sampled_from(["bad item", "repeat", "drop all"]))
        if not items:
            break
        if kind == "bad item":
            items[draw(st.integers(0, len(items) - 1))] = draw(slo_item())
        elif kind == "repeat":
            items.append(draw(st.sampled_from(items)))
        else:
            items = []
    return ",".join(items)


# ---------------------------------------------------------------- workload specs
NUMBER_BAD = ["0", "-1", "nan", "inf", "-inf", "abc", "", "1e-300", "1e400"]
VALUES: dict[str, tuple[list[str], list[str]]] = {  # key -> (valid values, bad values)
    "n": (["1", "2", "7", "40"], ["0", "-3", "abc", "1e3", "", "100000000000", "4.5", "1" * 40]),
    "rate": (["0.5", "2", "20", "1e3"], NUMBER_BAD),
    "scale": (["0.5", "2", "10"], NUMBER_BAD),
    "cv": (["0", "0.5", "1", "3"], ["-1", "nan", "1e200", "x", "inf"]),
    "prompt": (["fixed(16)", "uniform(4,64)", "exp(50)", "exp(50,200)", "lognormal(40,0.5)", "lognormal(40,0.8,300)"],
               ["fixed(0)", "fixed(1e30)", "uniform(5,1)", "uniform(1,1e30)", "exp(-1)", "exp(nan)",
                "lognormal(10,inf)", "lognormal(10,-1)", "bogus(1)", "fixed()", "fixed(1.5)", "12", "fixed(1",
                "exp(1,2,3)", "exp(1e300)"]),
    "lengths": (["alpaca", "longbench", "gsm8k", "arxiv", "azure-conv", "azure-code", "mooncake",
                 "mix(alpaca:0.7,longbench:0.3)", "mix(gsm8k:1,arxiv:2)"],
                ["mix(alpaca:nan)", "mix()", "mix(alpaca)", "bogus", "mix(alpaca:-1)", "mix(alpaca:0)", "mix(bogus:1)",
                 "mix(alpaca:inf)", "mix(mix(alpaca:1):1", "mix(" * 2000 + "alpaca" + ":1)" * 2000]),
    "max_total": (["2", "64", "4096"], ["1", "0", "abc", "1000000000000"]),
    "window": (["0-600", "0.5-2.5", "1-5"], ["-100--50", "5-1", "abc", "0-inf", "0-", "1e400-2", "nan-3", "3-3"]),
    "offline": (["0", "0.3", "1"], ["2", "-0.1", "nan", "x"]),
    "priority": (["0:1,1:2", "5:1"], ["1:1,1:2", "x:1", "99999999999:1", "1:nan", "1:-1", "1", "0:0"]),
    "slo": (["ttft:2,tpot:0.1", "tbt:0.5", "ttft:1"], ["ttft:2,ttft:3", "ttft:0", "e2el:1", "", "ttft:nan"]),
    "zero": (["skip", "clamp"], ["maybe", ""]),
    "model": (["ChatGPT", "GPT-4"], ["nope"]),
    "log": (["Conversation log"], ["nope"]),
}
VALUES["output"] = VALUES["prompt"]
TEMPLATES = {  # a valid spec per source, as (key, value) pairs
    "poisson": [("rate", "5"), ("n", "12"), ("prompt", "uniform(4,64)"), ("output", "exp(20)")],
    "gamma": [("rate", "5"), ("cv", "2"), ("n", "12"), ("lengths", "alpaca")],
    "burst": [("n", "9"), ("prompt", "fixed(32)"), ("output", "uniform(1,16)")],
    "gsm8k": [("n", "5"), ("rate", "2")],
    "arxiv": [("rate", "1")],
    "azure-conv": [("window", "0-600")],
    "azure-code": [("n", "3")],
    "mooncake": [("rate", "2")],
    "burstgpt": [("zero", "clamp")],
}


def _path_value(source: str) -> st.SearchStrategy[str]:
    from servelab.workloads.spec import DEFAULT_FILES

    right = str(tiny_data_dir() / DEFAULT_FILES[source]) if source in DEFAULT_FILES else None
    others = [str(tiny_data_dir() / f) for f in DEFAULT_FILES.values()] + odd_paths()
    return st.sampled_from(([right] * 3 if right else []) + others)


def _value(key: str, source: str, good: bool) -> st.SearchStrategy[str]:
    if key == "path":
        return _path_value(source)
    valid, bad = VALUES.get(key, (["1"], ["x"]))
    return st.sampled_from(valid if good else bad)


@st.composite
def workload_specs(draw) -> str:
    """``SOURCE:k=v,...`` from a valid template, then up to two mutations."""
    from servelab.workloads.spec import VALID_KEYS

    source = draw(st.sampled_from(list(TEMPLATES) + ["poisson", "burst", "gamma"]))
    options = list(TEMPLATES[source])
    for _ in range(draw(st.integers(0, 2))):  # more valid keys
        key = draw(st.sampled_from([k for k in VALID_KEYS[source] if k not in dict(options)] or ["n"]))
        options.append((key, draw(_value(key, source, good=True))))
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(["bad value", "bad value", "bad value", "unknown key", "repeat key", "drop key",
                                     "junk", "bad source"]))
        if kind == "bad value":
            key = draw(st.sampled_from(list(VALID_KEYS[source]) if source in VALID_KEYS else ["n"]))
            options = [(k, v) for k, v in options if k != key] + [(key, draw(_value(key, source, good=False)))]
        elif kind == "unknown key":
            options.append((draw(st.sampled_from(["bogus", "N", "", "prompt ", "rates"])), "1"))
        elif kind == "repeat key" and options:
            options.append(draw(st.sampled_from(options)))
        elif kind == "drop key" and options:
            options.pop(draw(st.integers(0, len(options) - 1)))
        elif kind == "junk":
            options.append((draw(_junk(6)), draw(_junk(6))))
        elif kind == "bad source":
            source = draw(st.sampled_from(["", "poisso", "azure", "POISSON", "trace"]))
    return source + (":" + ",".join(f"{k}={v}" for k, v in options) if options else "")


# ---------------------------------------------------------------- policy specs
STR_CHOICES = {"order": ["fcfs", "sjf", "ljf", "priority", "lifo"], "preemption": ["recompute", "swap", "kill"],
               "boundaries": ["uniform", "exponential", "quantile", "x"], "offline_order": ["ljf", "sjf", "fcfs"],
               "offline_bucket": ["fullest", "oldest", "x"]}
INT_TEXTS = ["1", "2", "8", "64", "0", "-1", "abc", "8.5", "", "99999999999", "1e3", "true"]
FLOAT_TEXTS = ["0", "0.5", "2", "1e-3", "-1", "nan", "inf", "1e400", "abc", "", "1e300", "7200"]
BOOL_TEXTS = ["true", "false", "yes", "0", "maybe", "2", ""]
TUPLE_TEXTS = ["", "8", "4;16", "16;4", "a;b", "nan;1", "1;2;3;4;5;6;7;8"]
PRESET_EXTRA = {"distserve": {"num_prefill": int}, "bucketserve-pd": {"num_prefill": int}}


def policy_fields(name: str) -> dict[str, Any]:
    """Parameter name -> annotation for a policy or preset name ({} for an unknown name)."""
    from servelab.cluster.presets import PRESETS
    from servelab.core.policy import POLICIES

    names = POLICIES.names()  # loads every plugin, presets included
    base = {"distserve": "vllm", "bucketserve-pd": "bucketserve"}.get(name, name)
    fields: dict[str, Any] = {}
    if base in names and getattr(POLICIES.get(base), "Config", None) is not None:
        config = POLICIES.get(base).Config
        hints = typing.get_type_hints(config)
        fields = {f.name: hints[f.name] for f in dataclasses.fields(config) if f.init}
    if name == "multibin" and "multibin" in PRESETS:
        fields["settle_s"] = float
    return {**fields, **PRESET_EXTRA.get(name, {})}


def _texts_for(key: str, hint: Any) -> list[str]:
    if key in STR_CHOICES:
        return STR_CHOICES[key] + ["", "x"]
    args = typing.get_args(hint)
    inner = next((a for a in args if a is not type(None)), hint) if args and type(None) in args else hint
    extra = ["none"] if type(None) in args else []
    if typing.get_origin(inner) is tuple:
        return TUPLE_TEXTS + extra
    return {int: INT_TEXTS, float: FLOAT_TEXTS, bool: BOOL_TEXTS}.get(inner, ["x", "abc"]) + extra


@st.composite
def policy_specs(draw) -> str:
    from servelab.core.policy import POLICIES

    name = draw(st.sampled_from(POLICIES.names() + ["distserve", "bucketserve-pd", "multibin"] * 2
                                + ["fastest", "", "VLLM"]))
    fields = policy_fields(name)
    pieces = []
    for _ in range(draw(st.integers(0, 3))):
        if fields and draw(st.integers(0, 5)):
            key = draw(st.sampled_from(sorted(fields)))
            pieces.append(f"{key}={draw(st.sampled_from(_texts_for(key, fields[key])))}")
        else:
            pieces.append(draw(st.sampled_from(["bogus=1", "order", "=3", "x=", "a=b=c"]) | _junk(6)))
    if pieces and draw(st.integers(0, 6)) == 0:
        pieces.append(pieces[0])  # a repeated key
    return name + (":" + ",".join(pieces) if pieces else "")


# ---------------------------------------------------------------- trace and dataset files
TOKEN_BAD = ["0", "-4", "abc", "1.5", "", "1e3", "1" + "0" * 23, "true", "1\x002", "nan"]
JSON_TOKEN_BAD: list[Any] = [0, -1, True, False, None, 1.5, "abc", 1e30, 10**23, [3], {"n": 1}]


def _corrupt(draw, data: bytes) -> tuple[bytes, bool]:
    """Maybe make the bytes undecodable (Latin-1 byte, binary tail); returns (bytes, still valid)."""
    kind = draw(st.sampled_from(["none"] * 6 + ["latin1", "binary"]))
    if kind == "latin1":
        at = draw(st.integers(0, len(data)))
        return data[:at] + b"\xe9" + data[at:], False
    if kind == "binary":
        return data + b"\xff\xfe\x00" + draw(st.binary(max_size=16)), False
    return data, True


def _respell(draw, rows: list[list[str]], columns: list[int]) -> None:
    """Valid spellings a correct reader must accept: a quoted cell, spaces around a number."""
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        row, column = draw(st.integers(0, len(rows) - 1)), draw(st.sampled_from(columns))
        if rows[row][column].isdigit():
            rows[row][column] = draw(st.sampled_from(['"{}"', " {}", "{} ", "+{}"])).format(rows[row][column])


def _csv_file(draw, kind: str, header: list[str], rows: list[list[str]], valid: bool, expected_of) -> FileCase:
    """Join rows into CSV text; maybe add blank lines, a BOM, CRLF line ends, a broken header or row."""
    lines = [",".join(header)] + [",".join(r) for r in rows]
    structural = draw(st.sampled_from(["none"] * 5 + ["blank line", "bom", "crlf", "short header", "extra field",
                                                      "empty"]))
    if structural == "crlf":
        lines = [line + "\r" for line in lines]
    elif structural == "blank line":
        lines.insert(draw(st.integers(1, len(lines))), "")
    elif structural == "bom":
        lines[0] = "\ufeff" + lines[0]
    elif structural == "short header":
        lines[0] = ",".join(header[:-1])
        valid = False
    elif structural == "extra field":
        at = draw(st.integers(1, len(lines) - 1))
        lines[at] += ",9"
        valid = False
    elif structural == "empty":
        lines, valid = [], False
    data, decodable = _corrupt(draw, ("\n".join(lines) + "\n" if lines else "").encode("utf-8"))
    valid = valid and decodable
    return FileCase(kind, ".csv", data, expected_of() if valid else None)


def _mutate_cells(draw, rows: list[list[str]], columns: list[int], bad: list[str]) -> bool:
    """Replace 0-2 cells in ``columns`` with bad texts; returns whether the rows stay valid."""
    valid = True
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        row = draw(st.integers(0, len(rows) - 1))
        rows[row][draw(st.sampled_from(columns))] = draw(st.sampled_from(bad))
        valid = False
    return valid


def _fmt_stamp(units_100ns: int) -> str:
    base = datetime.datetime(2023, 11, 16, 18, 0, 0)
    seconds, frac = divmod(units_100ns, 10**7)
    return (base + datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%d %H:%M:%S") + f".{frac:07d}"


STAMP_BAD = ["yesterday", "NaT", "", "2023-02-30 00:00:00.0000000", "9999-12-31 23:59:59.9999999", "2023-11-16",
             "1600-01-01 00:00:00.0000000"]


@st.composite
def azure_files(draw) -> FileCase:
    """Azure LLM 2023: TIMESTAMP, ContextTokens, GeneratedTokens. Expected: (arrival_s, prompt, output) rows."""
    n = draw(st.integers(1, 5))
    stamps = draw(st.lists(st.integers(0, 86_400 * 10**7), min_size=n, max_size=n))
    tokens = draw(st.lists(st.tuples(st.integers(1, 5000), st.integers(1, 5000)), min_size=n, max_size=n))
    rows = [[_fmt_stamp(s), str(p), str(o)] for s, (p, o) in zip(stamps, tokens)]
    _respell(draw, rows, [1, 2])
    valid = _mutate_cells(draw, rows, [1, 2], TOKEN_BAD) and _mutate_cells(draw, rows, [0], STAMP_BAD)

    def expected():
        order = sorted(range(n), key=lambda i: (stamps[i], i))
        return [((stamps[i] - min(stamps)) / 1e7, *tokens[i]) for i in order]

    return _csv_file(draw, "azure", ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], rows, valid, expected)


@st.composite
def burstgpt_files(draw) -> FileCase:
    """BurstGPT: rows with 0 tokens are skipped. Expected: (arrival_s, prompt, output) rows."""
    n = draw(st.integers(1, 5))
    times = draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n))
    tokens = draw(st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 3000)), min_size=n, max_size=n))
    model = draw(st.sampled_from(["ChatGPT", "GPT-4", "a,b"]))
    rows = [[str(t / 10), model, str(p), str(o), str(p + o), "Conversation log"] for t, (p, o) in zip(times, tokens)]
    _respell(draw, rows, [2, 3])
    valid = (_mutate_cells(draw, rows, [2, 3], [c for c in TOKEN_BAD if c != "0"])
             and _mutate_cells(draw, rows, [0], ["-1", "nan", "abc", "", "1e400", "true"]))
    kept = [i for i in range(n) if tokens[i][0] > 0 and tokens[i][1] > 0]
    valid = valid and bool(kept) and model != "a,b"

    def expected():
        order = sorted(kept, key=lambda i: (times[i], i))
        return [((times[i] - times[order[0]]) / 10, *tokens[i]) for i in order]

    header = ["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"]
    return _csv_file(draw, "burstgpt", header, rows, valid, expected)


@st.composite
def arxiv_files(draw) -> FileCase:
    """arXiv lengths CSV. Expected: (prompt, output) rows in file order."""
    tokens = draw(st.lists(st.tuples(st.integers(1, 20000), st.integers(1, 2000)), min_size=1, max_size=6))
    rows = [[str(p), str(o)] for p, o in tokens]
    _respell(draw, rows, [0, 1])
    valid = _mutate_cells(draw, rows, [0, 1], TOKEN_BAD)
    return _csv_file(draw, "arxiv", ["num_prefill_tokens", "num_decode_tokens"], rows, valid, lambda: list(tokens))


def _jsonl_file(draw, kind: str, records: list, required: list[str], valid: bool, expected_of) -> FileCase:
    lines = [json.dumps(r) for r in records]
    structural = draw(st.sampled_from(["none"] * 6 + ["blank line", "crlf", "bad json", "not object",
                                                      "missing key"]))
    if structural == "crlf":
        lines = [line + "\r" for line in lines]
    elif structural == "blank line":
        lines.insert(draw(st.integers(0, len(lines))), "   ")
    elif structural == "bad json":
        lines[draw(st.integers(0, len(lines) - 1))] = draw(st.sampled_from(['{"a": ', "{'a': 1}", "[[[[", "nul"]))
        valid = False
    elif structural == "not object":
        lines[draw(st.integers(0, len(lines) - 1))] = draw(st.sampled_from(["[1, 2]", "5", '"x"', "null"]))
        valid = False
    elif structural == "missing key":
        at = draw(st.integers(0, len(lines) - 1))
        record = dict(json.loads(lines[at]))
        record.pop(draw(st.sampled_from(required)))
        lines[at] = json.dumps(record)
        valid = False
    data, decodable = _corrupt(draw, ("\n".join(lines) + "\n").encode("utf-8"))
    return FileCase(kind, ".jsonl", data, expected_of() if valid and decodable else None)


@st.composite
def mooncake_files(draw) -> FileCase:
    """Mooncake JSONL. Expected: (arrival_s, prompt, output, hash_ids) rows."""
    n = draw(st.integers(1, 5))
    records = [{"timestamp": draw(st.integers(0, 10**6)), "input_length": draw(st.integers(1, 8000)),
                "output_length": draw(st.integers(1, 2000)),
                "hash_ids": draw(st.lists(st.integers(0, 10**6), max_size=4))} for _ in range(n)]
    values = [dict(r) for r in records]
    if draw(st.integers(0, 4)) == 0:  # lenient but exact spellings a correct loader accepts
        i = draw(st.integers(0, n - 1))
        records[i]["input_length"] = float(values[i]["input_length"])
        records[i]["extra"] = {"note": "ignored"}
    valid = True
    # 1e300 ms is a valid number but, next to another row, a span no clock can hold
    bad_times = [-1, True, None, "abc", "350", float("nan"), float("inf"), [1]] + ([1e300] if n > 1 else [])
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        record = records[draw(st.integers(0, n - 1))]
        key = draw(st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids"]))
        menus = {"timestamp": bad_times, "hash_ids": ["x", [True], [1.5], None, 5]}
        record[key] = draw(st.sampled_from(menus.get(key, JSON_TOKEN_BAD + ["12"])))
        valid = False

    def expected():
        order = sorted(range(n), key=lambda i: (values[i]["timestamp"], i))
        t0 = values[order[0]]["timestamp"]
        return [((values[i]["timestamp"] - t0) / 1000, values[i]["input_length"], values[i]["output_length"],
                 tuple(values[i]["hash_ids"])) for i in order]

    return _jsonl_file(draw, "mooncake", records, ["timestamp", "input_length", "output_length", "hash_ids"], valid,
                       expected)


@st.composite
def gsm8k_files(draw) -> FileCase:
    """GSM8K JSONL (question, answer). Expected: the questions in file order."""
    text = st.text(min_size=1, max_size=30).filter(lambda s: s.strip())
    records = draw(st.lists(st.fixed_dictionaries({"question": text, "answer": text}), min_size=1, max_size=4))
    questions = [r["question"] for r in records]
    valid = True
    for _ in range(draw(st.sampled_from([0, 0, 0, 1]))):
        record = records[draw(st.integers(0, len(records) - 1))]
        record[draw(st.sampled_from(["question", "answer"]))] = draw(st.sampled_from(["", "  ", 5, None, True, ["a"]]))
        valid = False
    return _jsonl_file(draw, "gsm8k", records, ["question", "answer"], valid, lambda: list(questions))


# ---------------------------------------------------------------- cost-model JSON
from reliability.cost_model_strategies import cost_model_files  # noqa: E402,F401  (defined there, used by name)
