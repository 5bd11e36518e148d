"""``servelab calibrate --base-url`` and ``servelab validate --base-url`` against a real
``servelab serve`` process on the tiny checkpoint (bounded: a 60 s probe budget, a dozen
short requests), plus the pieces that need no server: the decode window of a probe, the
limits read from a vLLM-style /metrics page, the probe plan under a server's limits."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from servelab.cli.main import app
from servelab.validate.probes import Probe, ProbeRun, probe_plan, samples_of
from servelab.validate.remote_validate import DRIFT_TRIES, RemoteOptions, drift_ratio
from servelab.validate.server_info import parse_metrics


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A ``servelab serve`` process on a tiny checkpoint (512 positions, vocab 512)."""
    from servelab.bench.compare import CompareOptions, start_server, stop_server
    from servelab.engine.tiny_model import gsm8k_texts, make_tiny_model, train_tokenizer

    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("remote")
    ckpt = make_tiny_model(folder / "ckpt", tokenizer=train_tokenizer(gsm8k_texts(limit=2000), vocab_size=512),
                           max_position=512)
    options = CompareOptions(model=ckpt, cost_model=Path("unused"), workload="", rates=(1.0,), kv_budget_mb=8,
                             block_size=16, max_num_batched_tokens=256, max_num_seqs=8, progress=False,
                             startup_timeout_s=120)
    proc, url = start_server(options, folder / "server.jsonl")
    yield ckpt, url, folder
    stop_server(proc)


def test_calibrate_then_validate_against_servelab_serve(served):
    ckpt, url, folder = served
    runner = CliRunner()
    cost = folder / "fit.json"
    t0 = time.monotonic()
    r = runner.invoke(app, ["calibrate", "--base-url", url, "--out", str(cost), "--time-budget", "60",
                            "--tokenizer", str(ckpt), "--json"])
    assert r.exit_code == 0, r.output
    assert time.monotonic() - t0 < 60 + 30  # the budget bounds the probes
    assert "probe plan:" in r.output  # printed before it runs
    payload = json.loads(r.output[r.output.index('{\n  "out"'):])
    sources = payload["limits"]["sources"]
    # read from the server, not assumed: servelab serve exposes them as vLLM does
    assert sources["max_model_len"] == "/v1/models" and payload["limits"]["values"]["max_model_len"] == 512
    assert sources["block_size"] == "/metrics" and payload["limits"]["values"]["block_size"] == 16
    assert sources["num_gpu_blocks"] == "/metrics" and payload["limits"]["values"]["num_gpu_blocks"] > 0
    assert payload["limits"]["values"]["max_num_seqs"] == 8
    assert payload["limits"]["values"]["max_num_batched_tokens"] == 256
    assert payload["held_out"] is not None and payload["fit"]["num_samples"] >= 6
    raw = json.loads((folder / "fit.probes.json").read_text())
    assert raw["runs"] and all(len(q["token_times_s"]) == q["output_len"] for run in raw["runs"]
                               for q in run["requests"])
    # decode probes were batches of the sizes planned, within the server's 8 sequences
    assert {run["probe"]["batch"] for run in raw["runs"] if run["probe"]["kind"] == "decode"} <= {1, 2, 4, 8}

    out = folder / "val"
    r = runner.invoke(app, ["validate", "--base-url", url, "--cost-model", str(cost), "-w",
                            "poisson:rate=20,n=10,prompt=uniform(16,64),output=uniform(4,10)", "--tokenizer",
                            str(ckpt), "--out", str(out), "--rescale", "--json"])
    assert r.exit_code == 0, r.output
    m = json.loads(r.output[r.output.index('{\n  "out"'):])["metrics"]
    assert m["failed"] == [0, 0] and m["sim_unfinished"] == 0 and m["num_requests"] == 10
    for metric in ("ttft", "tpot", "e2e"):
        assert m["sim_vs_replay"][0][metric]["n"] == 10
        assert m["noise"][0][metric]["median"] is not None
        assert m["inside_noise"][metric] in (True, False)
    # the 3 drift probes each gave a sample, or were sent DRIFT_TRIES times and say why none
    assert m["drift"]["ratio"] > 0 and len(m["drift"]["per_probe"]) == 3
    assert all(p["samples"] >= 1 or (p["tries"] == DRIFT_TRIES and p["note"]) for p in m["drift"]["per_probe"])
    assert m["scaled_vs_replay"][0]["ttft"]["n"] == 10
    assert (out / "cdf.png").stat().st_size > 0 and (out / "requests.csv").read_text().count("\n") == 11
    assert "inside noise" in (out / "validate.md").read_text()


def test_bad_input_is_one_line(tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["validate", "--base-url", "http://127.0.0.1:9", "--cost-model", str(tmp_path / "no.json")])
    assert r.exit_code != 0 and "no such file" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["calibrate", "--base-url", "http://127.0.0.1:9", "--out", str(tmp_path / "c.json")])
    assert r.exit_code != 0 and "cannot reach" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["validate", "-w", "gsm8k"])  # neither --model nor --base-url
    assert r.exit_code != 0 and "give --model (our engine) or --base-url" in r.output
    r = runner.invoke(app, ["calibrate", "--base-url", "ftp://x", "--out", str(tmp_path / "c.json")])
    assert r.exit_code != 0 and "http://" in r.output


def test_decode_window_keeps_only_all_rows_decoding():
    """Two streams: B's first token comes 1 s after A's; A's gaps before that are not 2-row steps."""
    a = [0.0, 0.1, 0.2, 1.0, 1.05, 1.10, 1.15, 1.20]  # A decodes alone (0.1 s) until B joins
    b = [1.0, 1.05, 1.10, 1.15, 1.20, 1.25]
    requests = [{"start_s": -0.5, "token_times_s": t, "prompt_len": 100, "output_len": len(t), "error": ""}
                for t in (a, b)]
    (sample,), note = samples_of(Probe("decode", 100, 2, 8), requests)
    shape, seconds = sample
    assert note == "" and shape.num_decodes == 2 and seconds == pytest.approx(0.05)
    assert shape.decode_context_max > 100


def test_prefill_probe_gives_ttft_and_one_row_decodes():
    req = {"start_s": 10.0, "token_times_s": [10.5, 10.52, 10.54, 10.56], "prompt_len": 512, "output_len": 4,
           "error": ""}
    (pre, dec), _ = samples_of(Probe("prefill", 512, 1, 4), [req])
    assert pre[0].prefill_tokens == (512,) and pre[1] == pytest.approx(0.5)
    assert dec[0].num_decodes == 1 and dec[1] == pytest.approx(0.02)


def test_vllm_metrics_page_gives_block_size_and_blocks():
    page = ('# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
            '# TYPE vllm:cache_config_info gauge\n'
            'vllm:cache_config_info{block_size="32",cache_dtype="auto",enable_prefix_caching="False",'
            'num_cpu_blocks="None",num_gpu_blocks="6144",swap_space="0"} 1.0\n')
    assert parse_metrics(page) == {"block_size": 32, "num_gpu_blocks": 6144}


def test_probe_plan_respects_the_limits():
    plan = probe_plan({"max_model_len": 600, "max_num_batched_tokens": 256, "max_num_seqs": 4,
                       "num_gpu_blocks": 40, "block_size": 16})
    assert plan and max(p.batch for p in plan) <= 4
    assert all(p.prompt_len + p.max_tokens <= 600 for p in plan)
    assert all(p.prompt_len <= 256 for p in plan if p.kind == "prefill")
    assert all(p.batch * (p.prompt_len + p.max_tokens) <= 40 * 16 for p in plan if p.kind == "decode")


def test_repeat_noise_is_the_spread_between_repeats_of_one_probe():
    from servelab.core.plan import StepShape
    from servelab.validate.probes import ProbeRun
    from servelab.validate.remote_calibrate import repeat_noise

    shape = StepShape(num_decodes=2, decode_context_sum=200, decode_context_max=100)
    runs = [ProbeRun(Probe("decode", 100, 2, 8, r), [], [(shape, t)]) for r, t in enumerate((0.1, 0.3))]
    runs.append(ProbeRun(Probe("decode", 100, 4, 8), [], [(shape, 5.0)]))  # no repeat: not counted
    noise = repeat_noise(runs)
    assert noise["n"] == 2 and noise["median"] == pytest.approx(0.5)  # both 0.1 from their median 0.2


def test_request_overhead_is_the_ttft_no_step_explains():
    """Synthetic probes from a known line plus 40 ms on every TTFT: the overhead is recovered and
    taken off the TTFT samples only, so the step fit sees the line itself."""
    from servelab.core.plan import StepShape
    from servelab.costmodel.linear import fit_linear_cost_model
    from servelab.validate.probes import ProbeRun
    from servelab.validate.remote_calibrate import adjusted_samples, request_overhead

    def step(tokens, rows, ctx):
        return 0.010 + 0.001 * tokens + 0.002 * rows + 1e-6 * ctx

    runs = []
    for p in (32, 128, 512, 1024):
        runs.append(ProbeRun(Probe("prefill", p, 1, 4), [], [
            (StepShape((p,), (p,)), step(p, 1, 0) + 0.040),
            (StepShape(num_decodes=1, decode_context_sum=p + 2, decode_context_max=p + 2), step(1, 1, p + 2))]))
    for b in (2, 4, 8, 16):
        runs.append(ProbeRun(Probe("decode", 128, b, 12), [], [
            (StepShape(num_decodes=b, decode_context_sum=b * 134, decode_context_max=134), step(b, b, b * 134))]))
    overhead = request_overhead(runs)
    assert overhead == pytest.approx(0.040, rel=0.05)
    model, fit = fit_linear_cost_model(adjusted_samples(runs, overhead), attention_kernel="split-kv",
                                       token_factors=False)
    assert fit.max_rel_error < 0.05 and model.c_token == pytest.approx(0.001, rel=0.1)


def test_a_drift_probe_read_in_bursts_is_sent_again(monkeypatch):
    """Under CI load the client read one drift probe's tokens in one burst (no sample) and the
    ratio stood on two of the three shapes; such a probe is now sent again, and one that never
    gives a sample says why after DRIFT_TRIES tries."""
    import servelab.validate.probes as probes
    from servelab.core.plan import StepShape

    sent = []

    async def fake_run_plan(url, model, plan, budget, **kw):
        (probe,) = plan
        sent.append(probe.label)
        tries = sent.count(probe.label)
        shape = StepShape(num_decodes=probe.batch, decode_context_sum=probe.batch * probe.prompt_len,
                          decode_context_max=probe.prompt_len)
        if probe.batch == 8 and tries < 2 or probe.batch == 2:  # 8 rows: a burst once; 2 rows: always
            return [ProbeRun(probe, [], [], "2 of 2 streams read in bursts", (None, None))], []
        return [ProbeRun(probe, [], [(shape, 2.0)], "", (None, None))], []

    monkeypatch.setattr(probes, "run_plan", fake_run_plan)
    cost = type("Cost", (), {"step_time_s": lambda self, shape: 1.0})()
    limits = type("Limits", (), {"values": {"max_model_len": 2048, "max_num_batched_tokens": 2048,
                                            "max_num_seqs": 8}, "model": "m"})()
    d = drift_ratio(RemoteOptions(base_url="http://x", cost_model=Path("c.json"), workload=None), limits, cost)
    assert [p["tries"] for p in d["per_probe"]] == [1, 2, DRIFT_TRIES]
    assert [p["samples"] for p in d["per_probe"]] == [1, 1, 0]
    assert "bursts" in d["per_probe"][2]["note"] and d["ratio"] == 2.0
