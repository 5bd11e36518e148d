"""vLLM's option names mapped onto servelab's: chunked prefill, preemption mode, memory use."""

from __future__ import annotations

import pytest

import servelab.baselines  # noqa: F401  (registers the policies)
from servelab.cli.vocab import engine_kv_budget_bytes, policy_with_vllm_flags, reserve_fraction
from servelab.core.errors import UserError


def test_chunked_prefill_is_sarathi_with_the_step_budget():
    assert policy_with_vllm_flags("vllm", enable_chunked_prefill=True, max_num_batched_tokens=512) == \
        "sarathi:token_budget=512"
    assert policy_with_vllm_flags("sarathi:token_budget=256", enable_chunked_prefill=True,
                                  max_num_batched_tokens=512) == "sarathi:token_budget=256"
    assert policy_with_vllm_flags("vllm") == "vllm"
    with pytest.raises(UserError, match="chunked prefill"):
        policy_with_vllm_flags("static", enable_chunked_prefill=True)


def test_preemption_mode_is_the_policy_parameter():
    assert policy_with_vllm_flags("vllm", preemption_mode="swap") == "vllm:preemption=swap"
    assert policy_with_vllm_flags("sjf:preemption=swap", preemption_mode="swap") == "sjf:preemption=swap"
    for policy, mode, words in (("static", "swap", "no preemption"), ("vllm:preemption=swap", "recompute",
                                                                     "contradicts"), ("vllm", "drop", "recompute or")):
        with pytest.raises(UserError, match=words):
            policy_with_vllm_flags(policy, preemption_mode=mode)


def test_memory_utilization():
    assert reserve_fraction(0.9) == pytest.approx(0.1)
    assert engine_kv_budget_bytes(0.5, 2 << 30, 2, 16 << 30) == 3 << 30  # (8 - 2) GiB over 2 instances
    for bad in (0, 1.5, float("nan")):
        with pytest.raises(UserError):
            reserve_fraction(bad)
    with pytest.raises(UserError, match="weights"):
        engine_kv_budget_bytes(0.1, 4 << 30, 1, 16 << 30)


def test_simulate_and_generate_take_the_vllm_names(tmp_path):
    from typer.testing import CliRunner

    from servelab.api import HardwareChoice
    from servelab.cli.main import app

    groups = HardwareChoice(block_size=32, gpu_memory_utilization=0.5, max_batch_tokens=512).cluster("vllm").groups
    assert (groups[0].block_size, groups[0].memory_reserve_fraction, groups[0].max_batch_tokens) == (32, 0.5, 512)
    assert HardwareChoice().cluster("vllm").groups[0].memory_reserve_fraction == 0.1  # the default is unchanged
    runner = CliRunner()
    workload = "poisson:rate=4,n=20,prompt=fixed(64),output=fixed(8)"
    r = runner.invoke(app, ["simulate", "-w", workload, "--enable-chunked-prefill", "--max-num-batched-tokens", "128",
                            "--max-num-seqs", "64", "--preemption-mode", "recompute", "--json", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert '"policy": "sarathi:token_budget=128,preemption=recompute"' in r.output
    r = runner.invoke(app, ["simulate", "-w", workload, "--gpu-memory-utilization", "0", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "--gpu-memory-utilization" in r.output
    import typer

    commands = typer.main.get_command(app).commands
    for command in ("simulate", "generate", "serve"):
        options = {o for p in commands[command].params for o in p.opts}
        for name in ("--max-num-seqs", "--max-num-batched-tokens", "--gpu-memory-utilization", "--swap-space",
                     "--block-size", "--enable-chunked-prefill", "--preemption-mode"):
            assert name in options, (command, name)
