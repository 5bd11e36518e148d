"""``sweep`` / ``capacity`` ``--jobs 2``: the files one process writes, from two."""

import json

from typer.testing import CliRunner

from servelab.cli.main import app

runner = CliRunner()
SMALL = "poisson:rate=20,n=60,prompt=uniform(16,256),output=uniform(1,64)"


def _sweep(tmp_path, name, *extra):
    out = tmp_path / name
    res = runner.invoke(app, ["sweep", "-w", SMALL, "--policies", "vllm,sarathi", "--rates", "5,20", "--out",
                              str(out), "--json", *extra])
    assert res.exit_code == 0, res.output
    rows = json.loads((out / "sweep.json").read_text())["rows"]
    csvs = {p.name: p.read_text() for p in sorted((out / "requests").iterdir())}
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows], csvs


def test_sweep_jobs_2_writes_what_one_process_writes(tmp_path):
    assert _sweep(tmp_path, "jobs2", "--jobs", "2") == _sweep(tmp_path, "serial")


def test_capacity_jobs_2_same_capacity_json(tmp_path):
    def capacity(name, *extra):
        res = runner.invoke(app, ["capacity", "-w", SMALL, "--policy", "vllm", "--lo", "2", "--hi", "200",
                                  "--max-expansions", "1", "--out", str(tmp_path / name), "--json", *extra])
        assert res.exit_code == 0, res.output
        payload = json.loads((tmp_path / name / "capacity.json").read_text())
        for key in ("command", "created_utc"):  # how and when it was run, not what it found
            payload["context"].pop(key, None)
        return payload

    assert capacity("jobs2", "--jobs", "2") == capacity("serial")


def test_ray_address_without_ray_backend_is_one_line(tmp_path):
    res = runner.invoke(app, ["sweep", "-w", SMALL, "--policies", "vllm", "--rates", "5", "--out", str(tmp_path),
                              "--ray-address", "ray://nowhere:1"])
    assert res.exit_code == 2
    assert "--ray-address needs --backend ray" in res.output and "Traceback" not in res.output
