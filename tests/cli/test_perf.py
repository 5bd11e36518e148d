"""``servelab perf``: the former argparse bench scripts as typer commands, same flags."""

import json
import subprocess
import sys

from typer.testing import CliRunner

from servelab.cli.main import app

runner = CliRunner()
SMALL = "poisson:rate=5,n=40,prompt=fixed(128),output=fixed(16)"


def test_perf_simulator_reports_json():
    res = runner.invoke(app, ["perf", "simulator", "--workload", SMALL, "--repeats", "2", "--time-decisions"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["requests"] == 40 and len(out["runs"]) == 2 and out["runs"][0]["conserved"]
    assert out["runs"][0]["tokens"] == 40 * 16 and out["runs"][0]["schedule_calls"] > 0


def test_perf_runs_in_a_fresh_process_with_its_flags():
    res = subprocess.run([sys.executable, "-m", "servelab.cli.main", "perf", "simulator", "--workload", SMALL,
                          "--repeats", "1", "--no-fast-forward"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["fast_forward"] is False


def test_engine_steps_on_a_tiny_checkpoint(tmp_path):
    from servelab.engine.tiny_model import make_tiny_model

    path = make_tiny_model(tmp_path / "tiny")
    res = runner.invoke(app, ["perf", "engine-steps", "--checkpoint", str(path), "--batch", "1,2", "--context", "16",
                              "--steps", "1"])
    assert res.exit_code == 0, res.output
    assert "batch   1:" in res.stdout and "batch   2:" in res.stdout


def test_bad_list_is_one_line():
    res = runner.invoke(app, ["perf", "engine-steps", "--batch", "1,x"])
    assert res.exit_code == 2 and res.stderr.strip() == "error: --batch: expected comma-separated integers, got '1,x'"
