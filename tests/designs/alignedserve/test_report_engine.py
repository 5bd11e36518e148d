"""Figs. 1/3 measured on the CPU engine: each decode kernel's stated reason and its test."""

from __future__ import annotations

import pytest

from servelab.core.errors import UserError
from servelab.designs.alignedserve.reproduce.report_engine import engine_lines


def _rows(ms: dict[int, list[float]]) -> list[dict]:
    base = sorted(ms[0])[len(ms[0]) // 2]
    return [{"num_long": n, "decode_step_ms": sorted(v)[len(v) // 2], "repeats_ms": v,
             "vs_all_short": sorted(v)[len(v) // 2] / base} for n, v in ms.items()]


def _eng(split, padded):
    return {"device": "cpu, 1 thread", "batch": 16, "short": 32, "long": 1536, "repeats": 3,
            "kernels": {"split-kv": {"rows": _rows(split)}, "padded": {"rows": _rows(padded)}}}


def test_a_step_linear_in_the_long_rows_and_a_flat_padded_step_keep_their_reasons():
    text = "\n".join(engine_lines(_eng({0: [4.0, 4.1, 3.9], 1: [5.5, 5.6, 5.4], 2: [7.0, 7.1, 6.9], 4: [10.0, 10.2, 9.9]},
                                       {0: [4.0, 4.0, 4.1], 1: [12.0, 12.3, 11.8], 2: [12.2, 12.0, 12.5], 4: [12.4, 12.1, 12.6]})))
    assert "off by 0% (not refuted)" in text
    assert "they differ by 3% (not refuted)" in text


def test_reasons_are_refuted_where_the_numbers_disagree():
    text = "\n".join(engine_lines(_eng({0: [4.0] * 3, 1: [9.0] * 3, 2: [9.5] * 3, 4: [10.0] * 3},
                                       {0: [4.0] * 3, 1: [6.0, 6.1, 5.9], 2: [8.0, 8.1, 7.9], 4: [12.0, 12.1, 11.9]})))
    assert "split-kv" in text and "(refuted)." in text
    assert "refuted: the long rows' count matters beyond the longest context" in text


def test_the_engine_runs_the_decode_kernel_it_is_given(monkeypatch):
    from servelab.designs.alignedserve.reproduce import motivation
    from servelab.engine import runner

    seen = []

    class Spy(runner.ModelRunner):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append(self.decode_kernel)

    monkeypatch.setattr(runner, "ModelRunner", Spy)
    eng = motivation.engine_measured(batch=4, long=512, max_tokens=8, fig3_lengths=(64, 512), repeats=1)
    assert set(eng["kernels"]) == {"split-kv", "padded"}
    assert eng["rows"] == eng["kernels"]["split-kv"]["rows"]
    assert all(len(r["repeats_ms"]) == 1 and r["decode_step_ms"] > 0 for k in eng["kernels"].values() for r in k["rows"])
    assert set(seen) == {"split-kv", "padded"}


def test_a_bad_decode_kernel_is_one_clear_error():
    from servelab.engine.cluster import EngineConfig

    with pytest.raises(UserError, match="decode_kernel"):
        EngineConfig(decode_kernel="flash")
