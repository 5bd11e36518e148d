"""Commands contributed by the designs and the engine, attached to the main app.

``reproduce`` and ``analyze`` are groups with one sub-command per design; each imports its
design's module only when run, so ``servelab --help`` stays fast and torch-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from servelab.cli.common import check_out_dir, emit_json, user_errors
from servelab.core.errors import UserError

reproduce_app = typer.Typer(no_args_is_help=True, help="Reproduce a paper's figures in the simulator.")
analyze_app = typer.Typer(no_args_is_help=True, help="Closed-form analysis of a design.")


def _reproduce(module: str, out: Path, reduced: bool, seed: int, json_out: bool, **options) -> None:
    import importlib

    with user_errors():
        check_out_dir(out)
        mod = importlib.import_module(f"servelab.designs.{module}.reproduce.run")
        result = mod.run_reproduction(out, reduced=reduced, seed=seed, progress=not json_out, **options)
    if json_out:
        emit_json(result)
    else:
        typer.echo(f"wrote {out}/{module}.md and its plots")


@reproduce_app.command("multibin")
def reproduce_multibin(
    out: Path = typer.Option(Path("results/reproduction"), help="Folder for multibin.md and plots."),
    reduced: bool = typer.Option(False, help="Smaller sizes (about a minute)."),
    seed: int = typer.Option(0),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Multi-Bin Batching: Figures 3, 4, 6, 7, 8 against the closed forms and the paper."""
    _reproduce("multibin", out, reduced, seed, json_out)


@reproduce_app.command("multibin-engine")
def reproduce_multibin_engine(
    out: Path = typer.Option(Path("results/reproduction"), help="Folder for multibin_engine.md and its plot."),
    num_requests: int = typer.Option(128, help="GSM8K requests in the Figure 7 burst (the paper uses all 7473)."),
    ks: str = typer.Option("1,2,4,8,16", help="Comma-separated numbers of bins."),
    model: Optional[Path] = typer.Option(None, help="Checkpoint folder; default: make the bench-30m preset in a "
                                                    "temporary folder."),
    seed: int = typer.Option(0),
    threads: int = typer.Option(1, help="torch threads (1 is fastest on a shared 2-core machine)."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Multi-Bin Batching Figures 5 and 7 measured on the real engine (CPU), next to the simulators."""
    with user_errors():
        check_out_dir(out)
        try:
            k_values = tuple(int(k) for k in ks.split(",") if k.strip())
        except ValueError:
            raise UserError(f"--ks must be comma-separated integers, got {ks!r}") from None
        if not k_values or not all(1 <= k <= num_requests for k in k_values):
            raise UserError(f"--ks must list bin counts in [1, --num-requests={num_requests}], got {ks!r}")
        if num_requests < 1 or threads < 1:
            raise UserError(f"--num-requests and --threads must be >= 1, got {num_requests} and {threads}")
        from servelab.designs.multibin.reproduce.engine import run_engine_reproduction  # imports torch

        command = (f"servelab reproduce multibin-engine --num-requests {num_requests} --ks {ks} --seed {seed} "
                   f"--out {out}" + (f" --model {model}" if model else ""))
        result = run_engine_reproduction(out, num_requests=num_requests, ks=k_values, seed=seed,
                                         progress=not json_out, model_dir=model, threads=threads, command=command)
    if json_out:
        emit_json(result)
    else:
        typer.echo(f"wrote {out}/multibin_engine.md and its plot")


@reproduce_app.command("bucketserve")
def reproduce_bucketserve(
    out: Path = typer.Option(Path("results/reproduction"), help="Folder for bucketserve.md and plots."),
    reduced: bool = typer.Option(False, help="Smaller sizes (about 30 s)."),
    seed: int = typer.Option(0),
    engine: bool = typer.Option(True, "--engine/--no-engine", help="Also measure ragged vs padded bucket prefills "
                                                                    "on the real engine (CPU, needs torch)."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """BucketServe: its claims at the paper's operating points against UELLM and DistServe, and the gap tests."""
    _reproduce("bucketserve", out, reduced, seed, json_out, engine=engine)


@reproduce_app.command("dynaserve")
def reproduce_dynaserve(
    out: Path = typer.Option(Path("results/reproduction"), help="Folder for dynaserve.md and plots."),
    reduced: bool = typer.Option(False, help="Smaller sizes (about a minute)."),
    seed: int = typer.Option(0),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """DynaServe: capacity, goodput, Table 1/2/4, Figs. 5/11, chunked transfer and scheduler time vs PD
    colocation (sarathi) and 1P1D disaggregation, with the gap tests."""
    _reproduce("dynaserve", out, reduced, seed, json_out)


@reproduce_app.command("alignedserve")
def reproduce_alignedserve(
    out: Path = typer.Option(Path("results/reproduction"), help="Folder for alignedserve.md and plots."),
    reduced: bool = typer.Option(False, help="Smaller sizes (4 GPUs, OPT-2.7B, about a minute)."),
    seed: int = typer.Option(0),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """AlignedServe: Figs. 1/3 (simulated, and measured on the CPU engine), 7-15, the batch-switch share,
    pool occupancy and Density First Search time against vllm, distserve and a FastGen stand-in, with the
    gap tests (simulated)."""
    _reproduce("alignedserve", out, reduced, seed, json_out)


@reproduce_app.command("kunserve")
def reproduce_kunserve(
    out: Path = typer.Option(Path("results/reproduction"), help="Folder for kunserve.md and plots."),
    reduced: bool = typer.Option(False, help="Smaller sizes (4 instances, LongBench only, about a minute)."),
    seed: int = typer.Option(0),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """KunServe: Figs. 12-16 (P99 TTFT, TPOT, SLO violation, ablation, restore, extreme bursts) and the
    drop-plan time against vllm, vllm-pp, infercept and llumnix, with the gap tests (simulated)."""
    _reproduce("kunserve", out, reduced, seed, json_out)


@analyze_app.command("multibin")
def analyze_multibin(
    distribution: str = typer.Option("uniform", help="uniform | exponential"),
    lmin: float = typer.Option(1.0), lmax: float = typer.Option(20.0), mu: float = typer.Option(0.1),
    batch_size: int = typer.Option(128), k_max: int = typer.Option(8),
    eps: Optional[float] = typer.Option(None, help="Report the smallest k with throughput >= c_max - eps."),
    arrival_rate: Optional[float] = typer.Option(None, help="Also give the expected latency (Lemma 5.1)."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Throughput_k (Thm 4.2), c_max (Eq. 5), k(eps) (Thm 4.3), latency (Lemma 5.1), exponential bound."""
    from servelab.designs.multibin.theory import analyze, format_analysis

    with user_errors():
        result = analyze(distribution, lmin=lmin, lmax=lmax, mu=mu, batch_size=batch_size, k_max=k_max, eps=eps,
                         arrival_rate=arrival_rate)
    if json_out:
        emit_json(result)
    else:
        from servelab.cli.common import print_markdown

        print_markdown(format_analysis(result))


def register(app: typer.Typer) -> None:
    from servelab.cli import reproduce_all  # reproduce all: every design above, one claims table

    reproduce_all.register(reproduce_app)
    app.add_typer(reproduce_app, name="reproduce")
    app.add_typer(analyze_app, name="analyze")
    from servelab.cli import serve_cmds  # typer only; FastAPI and torch load inside the commands

    serve_cmds.register(app)
    try:
        from servelab.cli import engine_cmds
    except ImportError:  # the engine commands are optional
        return
    engine_cmds.register(app)
    from servelab.cli import profile_gpu, validate_cmds  # torch loads inside the commands

    profile_gpu.register(app)

    validate_cmds.register(app)
