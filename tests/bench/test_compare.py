"""serve-vs-sim end to end on the tiny model: a real ``servelab serve`` process, the benchmark,
the server's request log joined by response id, and the simulator on the same requests."""

from __future__ import annotations

import json

import pytest

from servelab.bench.compare import CompareOptions, run_compare
from servelab.bench.compare_report import render


@pytest.mark.slow
def test_serve_vs_sim_one_rate(bench_checkpoint, tmp_path):
    from servelab.engine.calibrate import REDUCED_GRID, calibrate
    from servelab.engine.loader import load_checkpoint

    cost, _, _ = calibrate(load_checkpoint(bench_checkpoint), REDUCED_GRID, block_size=16)
    cost_path = tmp_path / "cost.json"
    cost.save(cost_path)
    options = CompareOptions(model=bench_checkpoint, cost_model=cost_path,
                             workload="burst:n=8,prompt=uniform(16,64),output=uniform(4,12)", rates=(20.0,),
                             progress=False)
    payload = run_compare(options, tmp_path / "out")
    (row,) = payload["rows"]
    assert row["completed"] == 8 and row["failed"] == 0
    split = row["ttft_split_ms"]
    assert split["engine_ttft"]["n"] == 8  # every request joined with the server's log
    for part in ("client_to_server", "server_to_engine", "engine_to_client"):
        assert split[part]["median"] >= 0  # one clock: no part is negative
    # the parts add up to the client's TTFT, request by request, so their medians are close to it
    parts = sum(split[p]["median"] for p in ("client_to_server", "server_to_engine", "engine_ttft",
                                              "engine_to_client"))
    assert abs(parts - split["client_ttft"]["median"]) < 0.5 * split["client_ttft"]["median"] + 5
    assert row["sim"]["unfinished"] == 0 and row["sim"]["median_ttft_ms"] > 0
    assert json.loads((tmp_path / "out" / "serve_vs_sim.json").read_text())["rows"][0]["rate"] == 20.0
    text = render(payload, "servelab serve-vs-sim ...", "tiny")
    assert "| 20 | 8/8 |" in text and "HTTP overhead" in text
    assert "bench-200m" not in text and "--threads 1" not in text  # no provenance this run did not have


def test_serve_vs_sim_provenance_is_read_from_the_files(bench_checkpoint, tmp_path):
    """Issue 31 (6): the page named a preset, a calibrate command and "0M parameters" it never used."""
    from servelab.cli.serve_cmds import _cost_note, _model_note, count_text
    from servelab.engine.loader import load_config

    assert count_text(93_248) == "93.2K" and count_text(196_800_000) == "197M" and count_text(12) == "12"
    note = _model_note(bench_checkpoint)
    assert count_text(load_config(bench_checkpoint).num_params) in note and "0M" not in note
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"meta": {"processor": "x86_64", "torch_threads": "2", "date": "2026-11-27",
                                         "model": "/elsewhere/bench-200m", "source": "servelab calibrate"}}))
    text = _cost_note(cost, bench_checkpoint)
    assert "x86_64, 2 torch thread(s), on 2026-11-27" in text and "not on" in text
