"""Hypothesis strategy for linear cost-model JSON files (``servelab simulate --cost-model``):
a valid file, then up to two mutations (a bad coefficient, every coefficient 0, an unknown
version, ...). Split from ``strategies.py`` (which re-exports it) to keep modules small."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st
from reliability.strategies import FileCase, _corrupt

COEFFICIENT_BAD: list[Any] = [-1.0, float("nan"), float("inf"), True, False, "fast", None, 1e5, [1e-3]]


@st.composite
def cost_model_files(draw) -> FileCase:
    """A linear cost-model file. Expected: the coefficient dict, kv_bytes_per_token and meta."""
    from servelab.costmodel import linear
    from servelab.costmodel.linear import COEFFICIENTS, REQUIRED_COEFFICIENTS, SCHEMA, SCHEMA_VERSION

    readable = getattr(linear, "READABLE_VERSIONS", (SCHEMA_VERSION,))

    coefficients = {name: draw(st.one_of(st.floats(0, 1, allow_nan=False), st.integers(0, 3)))
                    for name in COEFFICIENTS if name in REQUIRED_COEFFICIENTS or draw(st.booleans())}
    data: dict[str, Any] = {"schema": SCHEMA, "version": SCHEMA_VERSION, "coefficients": dict(coefficients),
                            "kv_bytes_per_token": draw(st.integers(0, 10**6)), "meta": {"gpu": "cpu"},
                            "fit": draw(st.sampled_from([None, {"num_samples": 10, "median_rel_error": 0.01,
                                                                "p90_rel_error": 0.05, "max_rel_error": 0.1}]))}
    expected = (dict(coefficients), data["kv_bytes_per_token"], dict(data["meta"]))
    if not any(coefficients.get(name) for name in ("c_step", "c_token", "c_row")):
        expected = None  # every step would take 0 s
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        if not isinstance(data, dict):
            break
        kind = draw(st.sampled_from(["coefficient", "coefficient", "unknown coefficient", "missing coefficient",
                                     "all zero", "schema", "version", "kv", "meta", "fit", "top level"]))
        if kind == "all zero":
            data["coefficients"] = {name: 0 for name in data["coefficients"]}
        elif kind == "coefficient":
            data["coefficients"][draw(st.sampled_from(REQUIRED_COEFFICIENTS))] = draw(st.sampled_from(COEFFICIENT_BAD))
        elif kind == "unknown coefficient":
            data["coefficients"]["c_bogus"] = 1.0
        elif kind == "missing coefficient":
            data["coefficients"].pop(draw(st.sampled_from(REQUIRED_COEFFICIENTS)), None)
        elif kind == "schema":
            data["schema"] = draw(st.sampled_from(["other", None, 1]))
        elif kind == "version":
            data["version"] = draw(st.sampled_from([True, 1.5, max(readable) + 1, 0, str(SCHEMA_VERSION), None,
                                                    float(SCHEMA_VERSION), -1, 10**30]))
        elif kind == "kv":
            data["kv_bytes_per_token"] = draw(st.sampled_from([-1, True, 1.5, "512", None]))
        elif kind == "meta":
            data["meta"] = draw(st.sampled_from([{"tp": 2}, [], "x", {"gpu": None}]))
        elif kind == "fit":
            data["fit"] = draw(st.sampled_from([{}, {"num_samples": True, "median_rel_error": 0, "p90_rel_error": 0,
                                                     "max_rel_error": 0}, "good", [1]]))
        else:
            data = draw(st.sampled_from([[], "x", 5, None]))
        expected = None
    text = json.dumps(data)
    raw = draw(st.sampled_from(["json"] * 8 + ["truncated", "empty"]))
    if raw == "truncated":
        text, expected = text[: len(text) // 2], None
    elif raw == "empty":
        text, expected = "", None
    body, decodable = _corrupt(draw, text.encode("utf-8"))
    return FileCase("cost_model", ".json", body, expected if decodable else None)
