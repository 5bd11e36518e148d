"""How a run's endings reach the user: aborted requests set exit status 3 (with one stderr
line), rejections do not; the summary headline counts both with their top reasons; vLLM's
--swap-space, --max-model-len and --on-overflow reach the simulated cluster."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from servelab.cli.common import EXIT_ABORTED
from servelab.cli.main import app
from servelab.core.plan import EMPTY_PLAN
from servelab.core.policy import POLICIES, SchedulingPolicy

runner = CliRunner()
SMALL = "poisson:rate=20,n=12,prompt=uniform(16,256),output=uniform(1,64)"


@POLICIES.register("test_never_runs", hidden=True)
class NeverRuns(SchedulingPolicy):
    """Queues every request and never schedules one: each ends aborted when the run ends."""

    def schedule(self, now_s, state):
        return EMPTY_PLAN


def _flat(text: str) -> str:
    """Rich wraps the headline to the terminal's width: compare it with single spaces."""
    return " ".join(text.split())


def test_an_aborted_request_sets_exit_status_3_after_the_results(tmp_path):
    res = runner.invoke(app, ["simulate", "-w", SMALL, "-p", "test_never_runs", "--out", str(tmp_path)])
    assert res.exit_code == EXIT_ABORTED == 3, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aborted requests (exit status 3): test_never_runs: 12 of 12 (")
    assert "the policy never ran it" in lines[0]
    assert "test_never_runs: 12 arrived, 0 completed, 0 rejected, 12 ABORTED; top abort reasons: 12 x the run " \
           "ended" in _flat(res.stdout)  # the headline under the table
    assert json.loads((tmp_path / "summary.json").read_text())["num_aborted"] == 12


def test_json_output_still_exits_3_and_prints_the_payload(tmp_path):
    res = runner.invoke(app, ["simulate", "-w", SMALL, "-p", "test_never_runs", "--json", "--out", str(tmp_path)])
    assert res.exit_code == 3
    assert json.loads(res.stdout)["num_aborted"] == 12


def test_sweep_exits_3_naming_the_run_that_aborted(tmp_path):
    res = runner.invoke(app, ["sweep", "-w", SMALL, "--policies", "vllm,test_never_runs", "--rates", "10",
                              "--out", str(tmp_path), "--json"])
    assert res.exit_code == 3, res.output
    rows = {r["policy"]: r for r in json.loads(res.stdout)["rows"]}
    assert (rows["vllm"]["aborted"], rows["test_never_runs"]["aborted"]) == (0, 12)
    assert "test_never_runs at rate 10: 12 of 12" in res.stderr and "vllm at" not in res.stderr


def test_rejections_alone_exit_0_and_are_counted_by_reason(tmp_path):
    """Prompts of 5,000 tokens exceed Llama-2-7B's 4,096 context: every request is rejected at
    admission, which is the rule working, not a failed run."""
    res = runner.invoke(app, ["simulate", "-w", "burst:n=5,prompt=fixed(5000),output=fixed(8)", "--out",
                              str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "vllm: 5 arrived, 0 completed, 5 rejected (5 over the context), 0 aborted; top rejection reasons: " \
           "5 x prompt N + max_tokens N exceeds max_model_len N" in _flat(res.stdout)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["num_rejected"], summary["num_rejected_context"], summary["num_completed"]) == (5, 5, 0)


def test_max_model_len_and_truncation_reach_the_cluster(tmp_path):
    base = ["simulate", "-w", "burst:n=4,prompt=fixed(900),output=fixed(100)", "--out", str(tmp_path), "--json"]
    rejected = json.loads(runner.invoke(app, base + ["--max-model-len", "512"]).stdout)
    assert (rejected["num_rejected_context"], rejected["num_completed"]) == (4, 0)
    truncated = json.loads(runner.invoke(app, base + ["--max-model-len", "512", "--on-overflow", "truncate"]).stdout)
    assert (truncated["num_rejected"], truncated["num_completed"]) == (0, 4)
    default = json.loads(runner.invoke(app, base).stdout)
    assert default["num_completed"] == 4


def test_readme_swap_example_swaps(tmp_path):
    """The README's `sarathi:...,preemption=swap --swap-space 4` runs and really swaps; without
    --swap-space it is a one-line error instead of a silent recompute."""
    workload = "burst:n=64,prompt=fixed(1000),output=fixed(1500)"  # 64 x 2,500 tokens > 7,609 blocks x 16
    spec = "sarathi:token_budget=256,preemption=swap"
    res = runner.invoke(app, ["simulate", "-w", workload, "-p", spec, "--swap-space", "4", "--json",
                              "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert payload["num_preemptions_swap"] > 0  # (recompute too once the 4 GiB of host KV are full)
    assert payload["num_completed"] == 64
    res = runner.invoke(app, ["simulate", "-w", workload, "-p", spec, "--out", str(tmp_path)])
    assert res.exit_code == 2 and "preemption=swap needs a host KV pool" in res.stderr
    assert "--swap-space GiB" in res.stderr


def test_bad_vllm_options_are_one_line(tmp_path):
    for args, message in ((["--swap-space", "-1"], "swap_space_gb must be in [0, 1024] GiB, got -1.0"),
                          (["--max-model-len", "100000"],
                           "max_model_len must be in [2, 4,096] (the context of Llama-2-7B), got 100000"),
                          (["--on-overflow", "drop"], "on_overflow must be one of reject, truncate, got 'drop'")):
        for command in (["simulate", "--out", str(tmp_path)], ["capacity"], ["sweep", "--out", str(tmp_path)]):
            res = runner.invoke(app, [*command, "-w", SMALL, *args])
            assert res.exit_code == 2 and res.stderr.strip() == f"error: {message}", (command, args, res.output)


def test_capacity_exits_3_when_a_probe_aborted(tmp_path):
    res = runner.invoke(app, ["capacity", "-w", SMALL, "-p", "test_never_runs", "--slo", "ttft:2s",
                              "--max-expansions", "0", "--out", str(tmp_path)])
    assert res.exit_code == 3, res.output
    assert res.stderr.startswith("aborted requests in capacity probes (exit status 3): 0.5 req/s: 12")
    written = json.loads((tmp_path / "capacity.json").read_text())
    assert written["num_aborted"] == 12 and written["probes"][0]["aborted"] == 12
