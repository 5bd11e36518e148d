"""servelab bench: goodput and percentile arithmetic, exact-length prompts, arrivals, and a
whole run against a live server (lengths forced, files written)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from servelab.bench.client import RequestResult
from servelab.bench.prompts import PromptMaker, corpus_texts, load_tokenizer, plan_requests
from servelab.bench.results import parse_goodput, summarize
from servelab.bench.run import arrival_times
from servelab.core.errors import UserError
from servelab.core.request import RequestSpec


def test_goodput_spec_like_vllm():
    assert parse_goodput(["ttft:500", "tpot:50"]) == {"ttft": 0.5, "tpot": 0.05}
    assert parse_goodput(["ttft:500 e2el:2000"]) == {"ttft": 0.5, "e2el": 2.0}
    assert parse_goodput(["ttft:0.5s", "tpot:50ms", "e2el:2000"]) == {"ttft": 0.5, "tpot": 0.05, "e2el": 2.0}
    for bad in (["ttft"], ["itl:5"], ["tbt:5"], ["ttft:-1"], ["ttft:x"], ["ttft:1", "ttft:2"], ["ttft:2min"]):
        with pytest.raises(UserError):
            parse_goodput(bad)


def test_summary_fields_and_goodput():
    def result(i, ttft, latency, n, itl):
        return RequestResult(i, success=True, ttft_s=ttft, latency_s=latency, prompt_len=10, output_len=n, itl_s=itl)

    results = [result(0, 0.1, 1.0, 10, [0.1] * 9),  # tpot 0.1
               result(1, 0.3, 0.5, 3, [0.1, 0.1]),  # tpot 0.1
               result(2, 0.2, 2.2, 5, [0.5] * 4),  # tpot 0.5
               RequestResult(3, error="HTTP 400: no")]
    s = summarize(results, 2.0, {"ttft": 0.25, "tpot": 0.2}, [50, 99])
    assert (s["completed"], s["failed"], s["total_output_tokens"], s["total_input_tokens"]) == (3, 1, 18, 30)
    assert s["request_throughput"] == 1.5 and s["output_throughput"] == 9.0
    assert s["request_goodput"] == 0.5  # only request 0 meets both targets
    assert s["median_ttft_ms"] == pytest.approx(200.0) and s["p50_tpot_ms"] == pytest.approx(100.0)
    assert s["mean_itl_ms"] == pytest.approx(1000 * (0.9 + 0.2 + 2.0) / 15)
    assert s["p99_e2el_ms"] == pytest.approx(np.percentile([1000, 500, 2200], 99))


def test_prompts_have_the_planned_token_count(bench_checkpoint):
    tokenizer = load_tokenizer(bench_checkpoint)
    lengths = [1, 2, 7, 33, 128, 300]
    specs = [RequestSpec(i, 0.0, n, 4) for i, n in enumerate(lengths)]
    planned, inexact = plan_requests(specs, np.zeros(len(specs)), tokenizer=tokenizer, corpus_texts=corpus_texts())
    counts = [len(tokenizer.encode(p.prompt).ids) for p in planned]
    exact = sum(c == n for c, n in zip(counts, lengths))
    assert exact == len(lengths) - inexact and inexact <= 1
    assert all(abs(c - n) <= 2 for c, n in zip(counts, lengths))
    ids, _ = plan_requests(specs, np.zeros(len(specs)), tokenizer=tokenizer, prompt_format="ids",
                           corpus_texts=corpus_texts())
    assert [len(p.prompt) for p in ids] == lengths  # token ids: always exact
    maker = PromptMaker(tokenizer, ["x"])
    assert maker.num_special == 1  # the BOS the checkpoint's tokenizer adds


def test_arrivals():
    specs = [RequestSpec(i, 5.0 + 2 * i, 4, 4) for i in range(2000)]
    assert arrival_times(specs, request_rate=math.inf, burstiness=1, trace_timing=False, seed=0).max() == 0
    trace = arrival_times(specs, request_rate=math.inf, burstiness=1, trace_timing=True, seed=0)
    assert trace[0] == 0 and trace[-1] == pytest.approx(2 * 1999)
    for burstiness in (0.25, 1.0, 4.0):
        t = arrival_times(specs, request_rate=10.0, burstiness=burstiness, trace_timing=False, seed=1)
        gaps = np.diff(t)
        assert gaps.mean() == pytest.approx(0.1, rel=0.15)
        assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.2)
    with pytest.raises(UserError):
        arrival_times(specs, request_rate=0, burstiness=1, trace_timing=False, seed=0)


def test_bench_against_a_live_server(bench_checkpoint, tmp_path):
    from servelab.bench.session import BenchOptions, bench_session
    from servelab.engine.cluster import EngineConfig
    from servelab.server.run import ServerConfig, ServerThread

    config = ServerConfig(model=bench_checkpoint, port=0, served_model_name="tiny",
                          engine=EngineConfig(kv_budget_bytes=8 << 20, block_size=4))
    with ServerThread(config) as server:
        options = BenchOptions(base_url=server.base_url, workload="poisson:rate=50,n=12,prompt=uniform(8,64),"
                               "output=uniform(2,20)", tokenizer=bench_checkpoint, request_rate=40.0,
                               goodput=("ttft:60000",), progress=False)
        summary, paths = bench_session(options, tmp_path)
        engine_requests = list(server.service.cluster.requests)
    from servelab.bench.session import plan

    planned, _ = plan(options)
    assert summary["completed"] == 12 and summary["failed"] == 0 and summary["model_id"] == "tiny"
    assert summary["output_lens"] == [p.output_len for p in planned]  # max_tokens + ignore_eos force them
    assert summary["input_lens"] == [p.prompt_len for p in planned] or summary["num_inexact_prompts"] > 0
    assert sorted(r.num_prompt_tokens for r in engine_requests) == sorted(summary["input_lens"])
    assert summary["request_goodput"] == pytest.approx(summary["request_throughput"])
    stem = f"bench-40qps-tiny-{summary['date']}"
    assert {p.name for p in paths} == {f"{stem}.json", f"{stem}_requests.csv", f"{stem}_cdf.png",
                                      f"{stem}_timeline.png"}
    saved = json.loads((tmp_path / f"{stem}.json").read_text())
    for key in ("duration", "request_throughput", "output_throughput", "mean_ttft_ms", "p99_tpot_ms",
                "median_itl_ms", "p90_e2el_ms", "ttfts", "itls", "errors"):
        assert key in saved
    rows = (tmp_path / f"{stem}_requests.csv").read_text().splitlines()
    assert len(rows) == 13 and rows[0].startswith("index,response_id,success")


def test_default_result_file_names_carry_model_date_and_never_replace(tmp_path):
    """Issue 31 (3): a rerun wrote over ``bench-4qps.json``; vLLM's name carries the date and time."""
    from servelab.bench.session import BenchOptions, default_filename, unique_path

    options = BenchOptions(base_url="http://x", workload="burst:n=1", request_rate=4.0)
    name = default_filename(options, "/tmp/models/tiny/", "20261127-140000")
    assert name == "bench-4qps-tiny-20261127-140000.json"
    capped = BenchOptions(base_url="http://x", workload="burst:n=1", max_concurrency=8)
    assert default_filename(capped, "org/Llama 2", "20261127-140000") == \
        "bench-infqps-concurrency8-Llama_2-20261127-140000.json"
    assert unique_path(tmp_path, name) == name
    (tmp_path / name).write_text("{}")
    assert unique_path(tmp_path, name) == "bench-4qps-tiny-20261127-140000-2.json"


def test_vllm_bench_flags_dataset_name_and_percentile_metrics():
    """Issue 31 (9): `vllm bench serve`'s --dataset-name random and --percentile-metrics work;
    another dataset name points to -w."""
    from servelab.bench.results import parse_percentile_metrics
    from servelab.cli.serve_cmds import bench_workload

    assert bench_workload(None, "random", 50, 256, 32) == "burst:n=50,prompt=fixed(256),output=fixed(32)"
    assert bench_workload("gsm8k:n=4", None, None, 1, 1) == "gsm8k:n=4"
    for args, words in (((None, "sharegpt", 5, 1, 1), "give -w"), (("gsm8k", "random", 5, 1, 1), "not both"),
                        ((None, None, 5, 1, 1), "--dataset-name random")):
        with pytest.raises(UserError, match=words):
            bench_workload(*args)
    assert parse_percentile_metrics("ttft,itl") == ("ttft", "itl")
    with pytest.raises(UserError, match="subset of ttft,tpot,itl,e2el"):
        parse_percentile_metrics("ttft,goodput")
    ok = [RequestResult(index=0, success=True, prompt_len=4, output_len=3, ttft_s=0.1, latency_s=0.3,
                        itl_s=[0.1, 0.1])]
    out = summarize(ok, 1.0, {}, [50, 99], ("ttft",))
    assert "p99_ttft_ms" in out and "p99_tpot_ms" not in out and "mean_tpot_ms" in out


def test_serve_takes_the_model_as_vllm_does():
    from typer.testing import CliRunner

    from servelab.cli.main import app
    from servelab.cli.serve_cmds import one_model

    assert one_model(Path("m"), None) == Path("m") == one_model(None, Path("m")) == one_model(Path("m"), Path("m"))
    runner = CliRunner()
    res = runner.invoke(app, ["serve"])
    assert res.exit_code == 2 and "servelab serve MODEL (or --model MODEL)" in res.output
    res = runner.invoke(app, ["serve", "a", "--model", "b"])
    assert res.exit_code == 2 and "two models given" in res.output
    res = runner.invoke(app, ["serve", "/nonexistent/ckpt"])
    assert res.exit_code == 2 and "/nonexistent/ckpt" in res.output and "Traceback" not in res.output


def test_bench_plots_have_titles_and_units(tmp_path, monkeypatch):
    """Issue 31 (11): the bench timeline had no title."""
    from matplotlib.figure import Figure

    from servelab.bench.plots import plot_results

    saved = []
    real = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (saved.append(fig), real(fig, *a, **k))[1])
    rows = [{"success": 1, "ttft_s": 0.1 * i, "tpot_s": 0.01, "e2el_s": 0.5 + 0.1 * i, "sent_s": 0.2 * i}
            for i in range(1, 5)]
    results = [RequestResult(index=i, success=True, itl_s=[0.01, 0.02]) for i in range(4)]
    paths = plot_results(tmp_path, "bench-x", rows, results)
    assert [p.name for p in paths] == ["bench-x_cdf.png", "bench-x_timeline.png"]
    cdf, timeline = saved
    assert "measured by the client" in cdf._suptitle.get_text()
    assert [a.get_ylabel() for a in cdf.axes] == ["fraction of requests"] * 2 + ["fraction of gaps",
                                                                                "fraction of requests"]
    ax = timeline.axes[0]
    assert "measured by the client" in ax.get_title() and ax.get_ylabel() == "latency (s)"
    assert "(s from start)" in ax.get_xlabel()
