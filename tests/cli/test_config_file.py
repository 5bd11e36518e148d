"""--config FILE.toml: the same options as the command line, checked by the same parsers."""

import json
from pathlib import Path

from typer.testing import CliRunner

from servelab.cli.main import app

runner = CliRunner()
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "simulate.toml"


def _write(tmp_path, text):
    path = tmp_path / "run.toml"
    path.write_text(text)
    return str(path)


def test_the_example_config_runs_and_its_values_reach_the_run(tmp_path):
    res = runner.invoke(app, ["simulate", "--config", str(EXAMPLE), "--json", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["context"]["workload"] == "poisson:rate=4,n=400,prompt=uniform(32,1024),output=exp(200)"
    assert out["policy"] == "sarathi:token_budget=512" and out["num_instances"] == 2
    assert out["context"]["slo"] == {"ttft_s": 2.0, "tpot_s": 0.1}


def test_the_command_line_overrides_the_file_and_a_section_overrides_the_top(tmp_path):
    config = _write(tmp_path, 'workload = "burst:n=10,prompt=fixed(64),output=fixed(8)"\ninstances = 3\n'
                              '[simulate]\ninstances = 2\n')
    out = json.loads(runner.invoke(app, ["simulate", "--config", config, "--json", "--out", str(tmp_path)]).stdout)
    assert out["num_instances"] == 2
    out = json.loads(runner.invoke(app, ["simulate", "--config", config, "-n", "1", "--json", "--out",
                                         str(tmp_path)]).stdout)
    assert out["num_instances"] == 1


def test_sweep_takes_lists(tmp_path):
    config = _write(tmp_path, 'workload = "poisson:rate=5,n=20,prompt=fixed(64),output=fixed(8)"\n'
                              '[sweep]\npolicies = ["vllm", "static:batch_size=4,max_wait_s=0.5"]\nrates = [2, 8]\n')
    res = runner.invoke(app, ["sweep", "--config", config, "--json", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert {(r["policy"], r["rate"]) for r in rows} == {(p, r) for p in ("vllm", "static:batch_size=4,max_wait_s=0.5")
                                                        for r in (2.0, 8.0)}


def test_errors_name_the_file_and_the_key(tmp_path):
    cases = {
        "instancez = 2\n": "unknown key 'instancez' for simulate; valid: ",
        'instances = "two"\n': "instances = 'two': Input should be a valid integer",
        "[simulate]\nrates = [1, 2]\n": "[simulate] unknown key 'rates' for simulate",
        "instances = \n": "not valid TOML",
        '[policy]\nname = "sarathi"\ntoken_budget = "lots"\n': "token_budget",
        "[workload]\nrate = 2\n": 'workload: needs source = "..."',
    }
    for text, message in cases.items():
        config = _write(tmp_path, text)
        res = runner.invoke(app, ["simulate", "--config", config, "--out", str(tmp_path)])
        assert res.exit_code == 2, (text, res.output)
        line = res.stderr.strip()
        assert len(line.splitlines()) == 1 and message in line, (text, line)
        assert "Traceback" not in res.output


def test_a_shared_key_for_another_command_is_ignored(tmp_path):
    config = _write(tmp_path, 'workload = "burst:n=4,prompt=fixed(32),output=fixed(4)"\nrates = [1, 2]\n')
    assert runner.invoke(app, ["simulate", "--config", config, "--out", str(tmp_path)]).exit_code == 0
