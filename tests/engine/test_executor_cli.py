"""The engine CLI commands end to end on the tiny model: outputs, summary, clear errors."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from servelab.cli.main import app


def test_generate_prompts_file_json(make_checkpoint, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text('Natalia sold clips to 48 of her friends.\n\n{"prompt": "Weng earns $12 an hour"}\n')
    res = CliRunner().invoke(app, ["generate", "--model", str(make_checkpoint()), "--prompts", str(prompts),
                                   "--max-tokens", "5", "--policy", "sarathi:token_budget=8", "--threads", "1",
                                   "--json"])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.output)
    assert [o["num_output_tokens"] for o in payload["outputs"]] == [5, 5]
    assert payload["summary"]["num_completed"] == 2


def test_generate_errors_are_messages_not_tracebacks(make_checkpoint, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": 3}\n')
    runner = CliRunner()
    res = runner.invoke(app, ["generate", "--model", str(make_checkpoint()), "--prompts", str(bad)])
    assert res.exit_code == 2 and "bad.jsonl:1" in res.output
    res = runner.invoke(app, ["generate", "--model", str(tmp_path / "nope"), "--prompts", str(bad)])
    assert res.exit_code == 2 and "not found" in res.output


def test_calibrate_reduced_writes_loadable_json(make_checkpoint, tmp_path):
    out = tmp_path / "cost.json"
    res = CliRunner().invoke(app, ["calibrate", "--model", str(make_checkpoint()), "--out", str(out),
                                   "--grid", "reduced", "--block-size", "4", "--json"])
    assert res.exit_code == 0, res.output
    from servelab.costmodel.linear import LinearCostModel

    assert LinearCostModel.load(out).c_token >= 0
