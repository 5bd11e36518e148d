"""The README demo: a real trace, four baselines, one table."""

from __future__ import annotations

from pathlib import Path

import typer

from servelab.cli.common import emit_json, write_json

DEMO_POLICIES = ("static:batch_size=32", "vllm", "sarathi", "distserve")
DEMO_SLO = "ttft:2,tpot:0.1"


def run_demo(data_dir: Path | None, out: Path, json_out: bool, workload: str = "azure-conv") -> None:
    from servelab.cli.common import console

    from servelab import api
    from servelab.cli.common import parse_slo, progress_bar
    from servelab.metrics.report import render_markdown, render_rich

    wl = api.load_workload(workload, data_dir=data_dir or api.DEFAULT_DATA_DIR)
    hw = api.HardwareChoice(num_instances=2, gpu="A100-80GB", model="Llama-2-7B")
    summaries, payload = {}, []
    for policy in DEMO_POLICIES:
        with progress_bar(f"simulating {policy}", not json_out) as cb:
            res = api.run_simulation(wl, policy, hw, slo=parse_slo(DEMO_SLO), progress=cb)
        summaries[policy] = res.summary
        payload.append(res.to_dict())
        if not json_out:
            typer.echo(f"{policy:>10}: {res.result.num_output_tokens:,} tokens simulated in {res.cpu_s:.1f} CPU-s")
    from servelab.cli.outputs import run_context

    context = run_context(workload=workload, seed=0, slo=parse_slo(DEMO_SLO), hardware=hw,
                          policies={p: api.check_policy(p, hw) for p in DEMO_POLICIES})
    write_json(out / "demo.json", {"context": context, "runs": payload})
    (out / "demo.md").write_text(render_markdown(summaries))
    if json_out:
        emit_json(payload)
        return
    console().print(render_rich(summaries, title=f"{workload}, 2 x A100-80GB, Llama-2-7B "
                                                 f"(simulated, profile cost model), SLO {DEMO_SLO}"))
    typer.echo(f"results in {out}/demo.json and demo.md")
