"""What a new user tripped over (issue 31): one SLO rule, printed; capacity and rejections;
``--config`` from any folder; the Python API's one argument order."""

import json
import warnings

import pytest
from typer.testing import CliRunner

from servelab import api
from servelab.cli.main import app

runner = CliRunner()
SMALL = "poisson:rate=20,n=40,prompt=uniform(16,256),output=uniform(1,64)"


def test_the_default_slo_is_printed_and_the_api_uses_the_same_one(tmp_path):
    res = runner.invoke(app, ["simulate", "-w", SMALL, "--out", str(tmp_path)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "SLO: ttft <= 2 s, tpot <= 100 ms (default; --slo to change, --slo none for none)" in res.stdout
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["context"]["slo"] == {"ttft_s": 2.0, "tpot_s": 0.1} and written["has_slo"]
    out = api.run_simulation(SMALL, "vllm")  # the API left alone: the same default, not nan
    assert out.summary.has_slo and out.summary.slo_attainment == written["slo_attainment"]
    assert out.slo_note.startswith("SLO: ttft <= 2 s, tpot <= 100 ms (default")


def test_a_workloads_own_slo_is_not_replaced_by_the_default(tmp_path):
    """Before: the default --slo replaced the spec's slo=ttft:1ms and reported 100%."""
    spec = SMALL + ",slo=ttft:1ms"
    res = runner.invoke(app, ["simulate", "-w", spec, "--json", "--out", str(tmp_path)])
    payload = json.loads(res.stdout)
    assert payload["slo_attainment"] == 0.0 and payload["context"]["slo"] is None
    assert payload["context"]["slo_note"] == "SLO: each request's own (the workload's slo=)"


def test_slo_none_and_strings_in_the_api():
    wl = api.load_workload(SMALL)
    assert not api.run_simulation(wl, "vllm", slo="none").summary.has_slo
    as_text = api.run_simulation(wl, "vllm", slo="ttft:50ms").summary.slo_attainment
    assert as_text == api.run_simulation(wl, "vllm", slo=api.SLO(ttft_s=0.05)).summary.slo_attainment


def test_capacity_one_order_the_clis_names_and_the_old_form_warns():
    wl = api.load_workload("poisson:rate=5,n=60,prompt=uniform(64,256),output=uniform(8,32)")
    new = api.capacity(wl, "vllm", api.HardwareChoice(), slo="ttft:2s", target=0.8, lo=1, hi=8, max_expansions=0)
    with pytest.warns(DeprecationWarning, match="capacity\\(workload, policy, hardware, slo=...\\)"):
        old = api.capacity(wl, "vllm", api.SLO(ttft_s=2.0), api.HardwareChoice(), target=0.8, lo=1, hi=8,
                           max_expansions=0)
    with pytest.warns(DeprecationWarning, match="target="):
        older = api.capacity(wl, "vllm", api.HardwareChoice(), slo="ttft:2s", target_attainment=0.8, lo=1, hi=8,
                             max_expansions=0)
    assert new.capacity_rate == old.capacity_rate == older.capacity_rate and new.probes == old.probes


def test_capacity_says_rejections_cap_attainment_and_lets_them_be_left_out(tmp_path):
    """About half the prompts can never fit --max-model-len: with rejections counted,
    attainment cannot pass about 0.5 at any rate; --rejections exclude judges the rest."""
    wl = "poisson:rate=2,n=80,prompt=uniform(100,4000),output=fixed(16)"
    args = ["capacity", "-w", wl, "--slo", "ttft:5s", "--target", "0.9", "--max-model-len", "2048", "--lo", "1",
            "--hi", "4", "--max-expansions", "1"]
    counted = runner.invoke(app, [*args, "--out", str(tmp_path / "a")], env={"COLUMNS": "300"})
    assert counted.exit_code == 0, counted.output
    written = json.loads((tmp_path / "a" / "capacity.json").read_text())
    rejected = written["probes"][0]["rejected"]
    assert rejected > 0 and written["status"] == "lo_fails"
    assert "cannot exceed" in written["rejection_note"] and "set by rejections" in written["rejection_note"]
    assert "rejections: " in counted.stdout and "--rejections exclude" in counted.stdout
    excluded = runner.invoke(app, [*args, "--rejections", "exclude", "--out", str(tmp_path / "b")])
    assert excluded.exit_code == 0, excluded.output
    written = json.loads((tmp_path / "b" / "capacity.json").read_text())
    assert written["status"] != "lo_fails" and written["rejections"] == "exclude"


def test_config_is_found_from_any_folder_or_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["simulate", "--config", "examples/simulate.toml", "--json", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["num_arrived"] == 400
    res = runner.invoke(app, ["simulate", "--config", "examples/none.toml"])
    assert res.exit_code == 2 and "no such file (looked in" in res.stderr and "Traceback" not in res.output
