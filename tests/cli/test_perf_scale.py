"""``servelab perf scale``: one point of the fleet-scale benchmark, as JSON."""

import json

from typer.testing import CliRunner

from servelab.cli.main import app

runner = CliRunner()


def test_perf_scale_point_json():
    res = runner.invoke(app, ["perf", "scale", "--instances", "3", "--requests", "15", "--repeats", "2"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["instances"] == 3 and out["requests"] == 2 * 45 and out["router"] == "least_loaded"
    assert out["workload"].startswith("poisson:rate=16.5,n=45,")
    assert len(out["fingerprints"]) == 2 and out["fingerprints"][0] != out["fingerprints"][1]  # seeds 0 and 1
    assert out["output_tokens"] >= 90 * 100 and out["tokens_per_cpu_s"] > 0 and out["peak_rss_gb"] > 0


def test_perf_scale_same_fingerprint_twice():
    """The fingerprint is a function of the simulated results only."""
    prints = []
    for _ in range(2):
        res = runner.invoke(app, ["perf", "scale", "--instances", "2", "--requests", "10"])
        assert res.exit_code == 0, res.output
        prints.append(json.loads(res.stdout)["fingerprints"])
    assert prints[0] == prints[1]


def test_perf_scale_bad_instances_is_one_line():
    res = runner.invoke(app, ["perf", "scale", "--instances", "0"])
    assert res.exit_code == 2 and "Traceback" not in res.output
