"""The CLI end to end on small inputs: JSON output, output files, and clear errors for bad input."""

import json

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
    rows = json.loads(res.output)
    assert {(r["policy"], r["rate"]) for r in rows} == {(p, r) for p in ("vllm", "static:batch_size=4")
                                                        for r in (5.0, 20.0)}
    assert (tmp_path / "slo_attainment.png").stat().st_size > 0


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
    assert res.exit_code != 0
    assert "SLO" in res.output or "slo" in res.output


def test_analyze_multibin_prints_closed_forms():
    res = runner.invoke(app, ["analyze", "multibin", "--k-max", "3", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert len(out["rows"]) == 3 and out["c_max"] > 0


def test_policy_monitor_figures_are_exported(tmp_path):
    """BucketServe's global monitor (memory, queue, arrival rate, lengths, batch latency) lands in results."""
    res = runner.invoke(app, ["simulate", "-w", SMALL, "-p", "bucketserve", "--json", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)["policy_reports"]["0"]
    assert report["num_arrivals"] == 60 and report["avg_seq_len"] > 0 and "bucket_edges" in report
