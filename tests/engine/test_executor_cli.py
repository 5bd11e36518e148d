"""The engine CLI commands end to end on the tiny model: outputs, summary, clear errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from servelab.cli.main import app


def test_generate_prompts_file_json(make_checkpoint, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text('Natalia sold clips to 48 of her friends.\n\n{"prompt": "Weng earns $12 an hour"}\n')
    res = CliRunner().invoke(app, ["generate", "--model", str(make_checkpoint()), "--prompts", str(prompts),
                                   "--max-tokens", "5", "--policy", "sarathi:token_budget=8", "--threads", "1",
                                   "--json", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.output)
    assert [o["num_output_tokens"] for o in payload["outputs"]] == [5, 5]
    assert payload["summary"]["num_completed"] == 2
    # generate --out (issue 31): the run's outputs and summary, per-request rows and steps on disk
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == payload
    assert len((tmp_path / "out" / "requests.csv").read_text().splitlines()) == 3
    assert (tmp_path / "out" / "timeseries.csv").read_text().startswith("instance_id,start_s")


def test_generate_errors_are_messages_not_tracebacks(make_checkpoint, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": 3}\n')
    runner = CliRunner()
    res = runner.invoke(app, ["generate", "--model", str(make_checkpoint()), "--prompts", str(bad)])
    assert res.exit_code == 2 and "bad.jsonl:1" in res.output
    res = runner.invoke(app, ["generate", "--model", str(tmp_path / "nope"), "--prompts", str(bad)])
    assert res.exit_code == 2 and "not found" in res.output


def test_calibrate_reduced_writes_loadable_json(make_checkpoint, tmp_path):
    """The file holds the fit of every timed shape, the instance's KV size and where it came
    from, and predicts what it was fitted on (the JSON payload says the same)."""
    from servelab.core.plan import StepShape
    from servelab.costmodel.linear import LinearCostModel
    from servelab.engine.calibrate import REDUCED_GRID, grid_points

    out = tmp_path / "cost.json"
    res = CliRunner().invoke(app, ["calibrate", "--model", str(make_checkpoint()), "--out", str(out),
                                   "--grid", "reduced", "--block-size", "4", "--json"])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)  # stderr may hold the held-out warning (14 steps are few)
    loaded = LinearCostModel.load(out)
    assert payload["coefficients"] == {name: getattr(loaded, name) for name in payload["coefficients"]}
    assert payload["fit"]["num_samples"] == loaded.fit.num_samples == len(grid_points(REDUCED_GRID))
    assert loaded.fit.median_rel_error < 0.5  # a linear model of a CPU engine step, within 50% typically
    # tiny model: 2 layers x 2 KV heads x head_dim 16 x (K and V) x 4 bytes (float32)
    assert loaded.kv_bytes_per_token == 2 * 2 * 16 * 2 * 4
    assert loaded.meta["block_size"] == "4" and loaded.meta["dtype"] == "float32"
    assert loaded.c_swap_block > 0  # the reduced grid times swaps
    one_decode, eight_decodes = StepShape(num_decodes=1, decode_context_sum=64), StepShape(num_decodes=8,
                                                                                            decode_context_sum=512)
    assert 0 < loaded.step_time_s(one_decode) <= loaded.step_time_s(eight_decodes) < 10.0


def test_generate_rejects_zero_max_tokens_before_serving(make_checkpoint, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("Natalia sold clips.\n")
    res = CliRunner().invoke(app, ["generate", "--model", str(make_checkpoint()), "--prompts", str(prompts),
                                   "--max-tokens", "0"])
    assert res.exit_code == 2 and res.stderr.strip() == "error: --max-tokens must be in [1, 100,000,000], got 0"


@pytest.mark.parametrize("extra, message", [
    (["--temperature", "-1"], "error: sampling temperature must be >= 0, got -1.0"),
    (["--kv-budget-mb", "nan"], "error: --kv-budget-mb must be in (0, 1,048,576], got nan"),
    (["--block-size", "0"], "error: engine block_size must be >= 1, got 0"),
    (["--swap-space", "-1"], "error: swap space must be in [0, 1024] GiB, got -1.0"),
    (["--max-model-len", "100000"], "error: max_model_len 100000 exceeds the model's"),
    (["--on-overflow", "drop"], "error: engine on_overflow must be one of reject, truncate, got 'drop'"),
    (["--kv-budget-mb", "0.0001"], "error: a KV budget of 104 bytes holds no block"),
    (["--threads", "0"], "error: --threads must be in [1, 1024], got 0"),
    (["--dtype", "float64"], "error: unsupported dtype 'float64'"),
    (["-p", "sjf:order=ljf"], "error: policy 'sjf': unknown parameter(s) ['order']"),
])
def test_generate_option_errors_are_one_line(make_checkpoint, tmp_path, extra, message):
    prompts = tmp_path / "p.txt"
    prompts.write_text("Natalia sold clips.\n")
    res = CliRunner().invoke(app, ["generate", "--model", str(make_checkpoint()), "--prompts", str(prompts), *extra])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1
    assert res.stderr.startswith(message), res.stderr


def test_undecodable_prompts_file_is_named(make_checkpoint, tmp_path):
    prompts = tmp_path / "p.bin"
    prompts.write_bytes(b"ok line\n\xff\xfe binary")
    res = CliRunner().invoke(app, ["generate", "--model", str(make_checkpoint()), "--prompts", str(prompts)])
    assert res.exit_code == 2
    assert res.stderr.strip() == f"error: prompts file {prompts}:2: not UTF-8 text (byte 0xff at column 1)"


def _generate(checkpoint, *args):
    res = CliRunner().invoke(app, ["generate", "--model", str(checkpoint), "--threads", "1", "--json", *args])
    return res, (json.loads(res.stdout) if res.stdout.strip().startswith("{") else None)


def test_generate_swap_space_makes_swap_preemption_swap(make_checkpoint):
    """8 GSM8K prompts of up to 64 new tokens on a 0.1 MiB KV cache (12 blocks) must preempt;
    with --swap-space they swap (the KV goes to host blocks), without it the spec is an error."""
    args = ["-w", "gsm8k:n=8", "-p", "vllm:preemption=swap", "--kv-budget-mb", "0.1", "--max-tokens", "64"]
    res, payload = _generate(make_checkpoint(), *args, "--swap-space", "0.01")
    assert res.exit_code == 0, res.output
    assert payload["summary"]["num_preemptions_swap"] > 0 and payload["summary"]["num_aborted"] == 0
    res, _ = _generate(make_checkpoint(), *args)
    assert res.exit_code == 2 and "preemption=swap needs a host KV pool" in res.stderr


def test_generate_max_model_len_rejects_or_truncates(make_checkpoint, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
                       "in May. How many clips did Natalia sell altogether in April and May?\nWeng earns\n")
    base = ["--prompts", str(prompts), "--max-tokens", "8", "--max-model-len", "24"]
    res, payload = _generate(make_checkpoint(), *base)
    assert res.exit_code == 0, res.output
    assert [o["status"] for o in payload["outputs"]] == ["rejected", "finished"]
    assert payload["summary"]["num_rejected_context"] == 1
    res, payload = _generate(make_checkpoint(), *base, "--on-overflow", "truncate")
    assert [(o["status"], o["num_prompt_tokens"]) for o in payload["outputs"]][0] == ("finished", 24 - 8)


def test_generate_exits_3_when_a_request_is_aborted(make_checkpoint, tmp_path):
    from servelab.core.plan import EMPTY_PLAN
    from servelab.core.policy import POLICIES, SchedulingPolicy

    if "test_engine_never_runs" not in POLICIES.names(include_hidden=True):
        @POLICIES.register("test_engine_never_runs", hidden=True)
        class NeverRuns(SchedulingPolicy):
            def schedule(self, now_s, state):
                return EMPTY_PLAN

    prompts = tmp_path / "p.txt"
    prompts.write_text("Natalia sold clips.\nWeng earns\n")
    res, payload = _generate(make_checkpoint(), "--prompts", str(prompts), "-p", "test_engine_never_runs")
    assert res.exit_code == 3, res.output
    assert payload["summary"]["num_aborted"] == 2
    assert res.stderr.startswith("aborted requests (exit status 3): test_engine_never_runs: 2 of 2 (")
