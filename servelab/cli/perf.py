"""``servelab perf``: the speed benchmarks as typer commands (they were four argparse scripts).

The benchmarks themselves (``servelab.simulator.bench``, ``servelab.engine.bench*``) sit below
the CLI and never import it; their former ``python -m`` entry points are these commands, same
flags (``python -m servelab.cli.main perf ...`` where no ``servelab`` script is installed).
Lists are comma-separated (``--batch 1,8,32``); policy lists repeat the flag (``--policy vllm --policy sarathi``), since
a policy spec holds commas. The engine modules import torch, so each command imports its
module only when it runs: ``servelab --help`` stays torch-free.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import typer

from servelab.cli.common import user_errors
from servelab.core.errors import UserError

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  help="Speed benchmarks: the simulator, engine decode steps, engine vs HF generate, "
                       "engine vs simulator per policy.")


def _ints(text: str, option: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{option}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise UserError(f"{option}: expected integers >= 1, got {text!r}")
    return values


@app.command("simulator")
def simulator(
    workload: str = typer.Option("azure-conv", help="Workload spec."),
    policy: str = typer.Option("vllm", help="Policy spec."),
    repeats: int = typer.Option(3, min=1),
    instances: int = typer.Option(1, min=1),
    no_fast_forward: bool = typer.Option(False, "--no-fast-forward", help="Step by step (no decode jumps)."),
    time_decisions: bool = typer.Option(False, "--time-decisions",
                                        help="Also time every policy.schedule call (adds a little overhead)."),
    data_dir: Optional[Path] = typer.Option(None, help="Folder with traces/ and datasets/ (default ../shared/data)."),
    op_times: str = typer.Option("profile", "--op-times", help="profile (the default cost model) | roofline."),
) -> None:
    """Simulator speed: a whole trace under one policy, CPU seconds and tokens per CPU-second (JSON)."""
    from servelab.paths import default_data_dir
    from servelab.simulator import bench

    with user_errors():
        bench.run(SimpleNamespace(workload=workload, policy=policy, repeats=repeats, instances=instances,
                                  no_fast_forward=no_fast_forward, time_decisions=time_decisions,
                                  data_dir=data_dir or default_data_dir(), op_times=op_times))


@app.command("scale")
def scale(
    instances: int = typer.Option(1, min=1, max=4096, help="Simulated instances."),
    requests: int = typer.Option(977, min=1, help="Requests per instance (977 x 1,024 instances = 1M)."),
    rate: float = typer.Option(5.5, min=0.001, help="Poisson arrivals per second per instance."),
    repeats: int = typer.Option(1, min=1, help="Workloads run back to back (seeds 0..repeats-1)."),
    reference_rounds: int = typer.Option(0, min=0, help="Run the point this many times, each between two runs "
                                         "of one instance in this process (the ratio's reference)."),
    reference_repeats: int = typer.Option(16, min=1, help="Workloads of each one-instance reference run."),
    data_dir: Optional[Path] = typer.Option(None, help="Folder with traces/ and datasets/ (default ../shared/data)."),
) -> None:
    """Simulator speed at equal load per instance: tokens per CPU-second and peak RSS of one point (JSON).

    scripts/scale_report.py runs it at 1 to 1,024 instances and writes docs/benchmarks/scale.md."""
    from servelab.paths import default_data_dir
    from servelab.simulator import scale_bench

    with user_errors():
        scale_bench.run(SimpleNamespace(instances=instances, requests=requests, rate=rate, repeats=repeats,
                                        reference_rounds=reference_rounds, reference_repeats=reference_repeats,
                                        data_dir=data_dir or default_data_dir()))


@app.command("engine-steps")
def engine_steps(
    checkpoint: Optional[str] = typer.Option(None, help="HF folder; default: random BENCH_200M weights."),
    dtype: str = typer.Option("float32", help="float32 | bfloat16 | float16"),
    batch: str = typer.Option("1,8,32", help="Comma-separated batch sizes."),
    context: int = typer.Option(256, min=1),
    steps: int = typer.Option(5, min=1),
    threads: int = typer.Option(1, min=1),
    stream: bool = typer.Option(False, "--stream", help="Also measure plain read bandwidth."),
) -> None:
    """Decode-step time vs the bytes a step must read (engine, CPU or GPU)."""
    with user_errors():
        args = SimpleNamespace(checkpoint=checkpoint, dtype=dtype, batch=_ints(batch, "--batch"), context=context,
                               steps=steps, threads=threads, stream=stream)
        from servelab.engine import bench

        if dtype not in bench.DTYPES:
            raise UserError(f"--dtype must be one of {', '.join(sorted(bench.DTYPES))}, got {dtype!r}")
        bench.run(args)


@app.command("engine-generate")
def engine_generate(
    model: str = typer.Option(..., help="HF checkpoint folder (servelab make-tiny-model --preset bench-200m)."),
    batch: str = typer.Option("1,8,32", help="Comma-separated batch sizes."),
    new_tokens: int = typer.Option(128, min=1),
    min_len: int = typer.Option(32, min=1),
    max_len: int = typer.Option(1024, min=1),
    threads: int = typer.Option(1, min=1),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """End-to-end decode throughput: the servelab engine vs HF transformers generate."""
    with user_errors():
        args = SimpleNamespace(model=model, batch=_ints(batch, "--batch"), new_tokens=new_tokens, min_len=min_len,
                               max_len=max_len, threads=threads, json=json_out)
        from servelab.engine import bench_generate

        bench_generate.run(args)


@app.command("engine-policies")
def engine_policies(
    model: str = typer.Option(...),
    cost_model: str = typer.Option(..., help="servelab calibrate output for this model and machine."),
    workload: str = typer.Option("gsm8k:n=64"),
    policy: Optional[list[str]] = typer.Option(None, "--policy", "--policies",
                                               help="Policy spec (repeat the flag; default: static, multibin, "
                                                    "bucketserve, vllm)."),
    max_output: Optional[int] = typer.Option(None, help="Cap output lengths (shorter runs)."),
    kv_budget_mb: float = typer.Option(512.0),
    max_num_seqs: int = typer.Option(64),
    max_batch_tokens: int = typer.Option(4096),
    sim_gpu: str = typer.Option("A100-80GB"),
    sim_model: str = typer.Option("Llama-2-7B"),
    threads: int = typer.Option(1, min=1),
    seed: int = typer.Option(0),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Policies on the real engine vs the simulator's prediction with this machine's cost model."""
    with user_errors():
        from servelab.engine import bench_policies

        args = SimpleNamespace(model=model, cost_model=cost_model, workload=workload,
                               policies=list(policy or bench_policies.DEFAULT_POLICIES), max_output=max_output,
                               kv_budget_mb=kv_budget_mb, max_num_seqs=max_num_seqs,
                               max_batch_tokens=max_batch_tokens, sim_gpu=sim_gpu, sim_model=sim_model,
                               threads=threads, seed=seed, json=json_out)
        bench_policies.run(args)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="perf")
