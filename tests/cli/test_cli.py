"""The CLI end to end on small inputs: JSON output, output files, and clear errors for bad input."""

import json

import pytest
from typer.testing import CliRunner

from servelab.cli.main import app

runner = CliRunner()
SMALL = "poisson:rate=20,n=60,prompt=uniform(16,256),output=uniform(1,64)"


def test_simulate_json_and_files(tmp_path):
    res = runner.invoke(app, ["simulate", "-w", SMALL, "-p", "sarathi:token_budget=256", "--json", "--out",
                              str(tmp_path)])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.output)
    assert payload["num_arrived"] == 60 and payload["num_completed"] == 60 and payload["conserved"]
    assert (tmp_path / "summary.json").exists()
    assert (tmp_path / "timeseries.csv").read_text().startswith("instance_id,start_s")


def test_sweep_writes_table_and_plots(tmp_path):
    res = runner.invoke(app, ["sweep", "-w", SMALL, "--policies", "vllm,static:batch_size=4", "--rates", "5,20",
                              "--out", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.output)
    rows = payload["rows"]
    assert payload["context"]["rates"] == [5.0, 20.0] and set(payload["context"]["policies"]) == {
        "vllm", "static:batch_size=4"}
    assert json.loads((tmp_path / "sweep.json").read_text())["rows"] == rows
    assert {(r["policy"], r["rate"]) for r in rows} == {(p, r) for p in ("vllm", "static:batch_size=4")
                                                        for r in (5.0, 20.0)}
    assert (tmp_path / "slo_attainment.png").stat().st_size > 0
    import csv  # a per-request CSV beside every point of the sweep, its rows the point's requests

    for r in rows:
        name = r["policy"].replace(":", "_")
        with (tmp_path / "requests" / f"{name}@{r['rate']:g}.csv").open() as f:
            assert len(list(csv.DictReader(f))) == r["arrived"]


def test_unknown_policy_is_a_clear_error():
    res = runner.invoke(app, ["simulate", "-w", SMALL, "-p", "fastest"])
    assert res.exit_code == 2
    assert "unknown policy 'fastest'" in res.output


def test_bad_trace_row_names_file_and_line(tmp_path):
    trace = tmp_path / "bad.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                     "2023-11-16 18:15:50.9951690,lots,109\n")
    res = runner.invoke(app, ["simulate", "-w", f"azure-conv:path={trace}"])
    assert res.exit_code == 2
    assert "bad.csv:3" in res.output


def test_bad_slo_is_rejected():
    res = runner.invoke(app, ["simulate", "-w", SMALL, "--slo", "ttft:-1"])
    assert res.exit_code == 2
    assert res.stderr.strip() == "error: --slo 'ttft:-1': ttft must be a finite duration > 0, got '-1'"


def test_simulate_json_keeps_the_instance_count(tmp_path):
    res = runner.invoke(app, ["simulate", "-w", SMALL, "-n", "2", "--json", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.output)
    assert payload["num_instances"] == 2 and len(payload["per_instance"]) == 2
    assert json.loads((tmp_path / "summary.json").read_text())["num_instances"] == 2


def test_analyze_multibin_prints_closed_forms():
    """Uniform U(1, 20), B = 128: c_max = B / E[l] (Eq. 5), throughput_k = B / E[service_k]
    rising with k towards c_max, and Eq. 20 matching the integrated Eq. 2."""
    res = runner.invoke(app, ["analyze", "multibin", "--k-max", "3", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["c_max"] == pytest.approx(128 / 10.5)
    rows = out["rows"]
    assert [r["num_bins"] for r in rows] == [1, 2, 3]
    assert [len(r["edges"]) for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["throughput"] == pytest.approx(128 / r["expected_service"])
        assert r["expected_service"] == pytest.approx(r["expected_service_numeric"], rel=1e-6)
    # one bin: the batch waits for the max of 128 uniforms on [1, 20], (1 + 128 * 20) / 129
    assert rows[0]["expected_service"] == pytest.approx((1 + 128 * 20) / 129)
    throughputs = [r["throughput"] for r in rows]
    assert throughputs == sorted(throughputs) and throughputs[-1] < out["c_max"]


def test_policy_monitor_figures_are_exported(tmp_path):
    """BucketServe's global monitor (memory, queue, arrival rate, lengths, batch latency) lands in results."""
    res = runner.invoke(app, ["simulate", "-w", SMALL, "-p", "bucketserve", "--json", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)["policy_reports"]["0"]
    assert report["num_arrivals"] == 60 and report["avg_seq_len"] > 0 and "bucket_edges" in report
