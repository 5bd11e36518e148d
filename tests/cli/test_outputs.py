"""What runs write: their own folder by default, their context, capacity's probes and bracketing."""

import json

from typer.testing import CliRunner

from servelab import __version__
from servelab.cli.main import app

runner = CliRunner()
SMALL = "poisson:rate=20,n=30,prompt=uniform(16,256),output=uniform(1,64)"


def test_default_out_is_a_new_folder_per_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = runner.invoke(app, ["simulate", "-w", SMALL])
    second = runner.invoke(app, ["simulate", "-w", SMALL])
    assert first.exit_code == second.exit_code == 0, first.output
    runs = sorted((tmp_path / "results" / "simulate").iterdir())
    assert len(runs) == 2 and all((r / "summary.json").exists() for r in runs)
    assert f"results in {runs[1].relative_to(tmp_path)}/" in " ".join(second.stdout.split())


def test_summary_carries_the_run_context(tmp_path):
    res = runner.invoke(app, ["simulate", "-w", SMALL, "-p", "sarathi:token_budget=256", "--instances", "2",
                              "--slo", "ttft:500ms,e2el:20s", "--seed", "3", "--tp", "2", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    ctx = summary["context"]
    assert ctx["servelab_version"] == __version__ and ctx["workload"] == SMALL and ctx["seed"] == 3
    assert ctx["slo"] == {"ttft_s": 0.5, "e2el_s": 20.0}
    assert (ctx["hardware"]["num_instances"], ctx["hardware"]["tp"], ctx["hardware"]["gpu"]) == (2, 2, "A100-80GB")
    group = ctx["policies"]["sarathi:token_budget=256"]["groups"][0]
    assert group["policy"] == "sarathi" and group["policy_params"]["token_budget"] == 256 and group["count"] == 2
    cost = ctx["cost_model"]  # every term of the step time names its source
    assert cost["kind"] == "profile" and cost["op up_proj"].startswith("measured: a100 profile of Llama-2-7b-hf tp=2")
    assert cost["all_reduce"].startswith("measured all-reduce") and "Ray" in cost["cpu_overhead"]
    assert cost["attention"].startswith("per-seq (default for A100-80GB)")
    assert summary["num_instances"] == 2 and len(summary["per_instance"]) == 2


def test_capacity_brackets_and_writes_its_probes(tmp_path):
    """The start range [100, 200] lies above the capacity (about 11 req/s here): the search
    lowers it 4x at a time until a rate passes, then bisects, and says so."""
    workload = "poisson:rate=20,n=200,prompt=uniform(256,1024),output=uniform(32,128)"
    res = runner.invoke(app, ["capacity", "-w", workload, "--slo", "ttft:200ms,tpot:50ms", "--lo", "100", "--hi",
                              "200", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    written = json.loads((tmp_path / "capacity.json").read_text())
    assert written["status"] == "found" and 6.25 <= written["capacity_rate"] < 25
    assert written["bracketing"] == ["100 req/s missed the target: tried 25", "25 req/s missed the target: tried 6.25"]
    assert "bracketing: 100 req/s missed the target: tried 25" in res.stdout
    assert written["context"]["lo"] == 100 and [p["rate"] for p in written["probes"][:3]] == [100, 25, 6.25]


def test_no_slo_means_no_attainment(tmp_path):
    res = runner.invoke(app, ["simulate", "-w", SMALL, "--slo", "none", "--json", "--out", str(tmp_path)])
    payload = json.loads(res.stdout)
    assert payload["has_slo"] is False and payload["slo_attainment"] is None
    table = runner.invoke(app, ["simulate", "-w", SMALL, "--slo", "none", "--out", str(tmp_path)]).stdout
    assert "no SLO given" in table


def test_an_implausible_slo_warns_in_one_line(tmp_path):
    res = runner.invoke(app, ["simulate", "-w", SMALL, "--slo", "ttft:2000", "--out", str(tmp_path), "--json"])
    assert res.exit_code == 0
    assert res.stderr.startswith("warning: --slo: ttft 2000 (a bare number is seconds)")
    assert "write ttft:2000ms" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def _cost_file(tmp_path, name, meta):
    from servelab.costmodel.linear import LinearCostModel

    path = tmp_path / f"{name}.json"
    LinearCostModel(c_step=1e-3, c_token=1e-5, c_decode_ctx=1e-8, c_prefill_attn=1e-10, c_row=1e-5,
                    meta=meta).save(path)
    return path


def test_calibrated_cost_model_names_its_machine_and_its_mfu_uses_that_peak(tmp_path):
    """MFU against the catalog GPU would change with --gpu for identical timings: a calibrated
    model's MFU uses the peak it recorded, or is left out."""
    base = ["simulate", "-w", SMALL, "--json", "--out", str(tmp_path)]
    cpu = _cost_file(tmp_path, "cpu", {"hardware": "CPU: test (2 cores)", "peak_flops": ""})
    runs = [json.loads(runner.invoke(app, base + ["--cost-model", str(cpu), "--gpu", g]).stdout) for g in
            ("A100-80GB", "H100-80GB")]
    assert all(i["mfu"] is None for r in runs for i in r["per_instance"])
    assert runs[0]["context"]["cost_model"]["measured_on"] == "CPU: test (2 cores)"
    gpu = _cost_file(tmp_path, "gpu", {"hardware": "NVIDIA X", "peak_flops": "1e12"})
    with_peak = json.loads(runner.invoke(app, base + ["--cost-model", str(gpu)]).stdout)
    assert with_peak["per_instance"][0]["mfu"] > 0
    table = runner.invoke(app, ["simulate", "-w", SMALL, "--cost-model", str(cpu), "--out", str(tmp_path)]).stdout
    assert "CPU: test (2 cores)" in table and "A100" not in table


def test_markdown_is_rendered_on_a_terminal_and_plain_when_piped(monkeypatch, capsys):
    import rich.console

    from servelab.cli.common import print_markdown

    text = "| k | x |\n|---|---|\n| 1 | 2 |\n\nc_max = 1\nsmallest k: 2"
    print_markdown(text)  # captured stdout is not a terminal
    assert capsys.readouterr().out == text + "\n"
    real = rich.console.Console
    monkeypatch.setattr(rich.console, "Console", lambda: real(force_terminal=True, width=60, color_system=None))
    print_markdown(text)
    shown = capsys.readouterr().out
    assert "|---|" not in shown
    assert [line.strip() for line in shown.splitlines() if line.strip()][-2:] == ["c_max = 1", "smallest k: 2"]


def test_sweep_without_an_slo_has_no_attainment_plot(tmp_path):
    res = runner.invoke(app, ["sweep", "-w", SMALL, "--policies", "vllm", "--rates", "5", "--slo", "none", "--out",
                              str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert not (tmp_path / "slo_attainment.png").exists() and (tmp_path / "throughput_tok_s.png").exists()
