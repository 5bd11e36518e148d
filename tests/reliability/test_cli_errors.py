"""Bad input on the command line: exit status 2 and one line on stderr naming the input,
never a traceback. Each case is one of the classes issue 8 found ending badly."""

from __future__ import annotations

import pytest
from reliability.tiny_data import tiny_data_dir
from typer.testing import CliRunner

from servelab.cli.main import app

SMALL = "burst:n=4,prompt=fixed(8),output=fixed(2)"


def _files(tmp_path):
    (tmp_path / "true.jsonl").write_text('{"timestamp": 0, "input_length": true, "output_length": 3, "hash_ids": []}\n')
    (tmp_path / "latin1.jsonl").write_bytes('{"question": "caf\xe9", "answer": "x"}\n'.encode("latin-1"))
    (tmp_path / "huge.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                       "2023-11-16 18:15:46.6805900,100000000000000000000000,4\n")
    (tmp_path / "cost.json").write_text('{"schema": "servelab.linear_cost_model", "version": 1, "coefficients": '
                                        '{"c_step": 0.01, "c_token": true, "c_decode_ctx": 0, "c_prefill_attn": 0, '
                                        '"c_row": 0}}')
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00\x01binary")
    (tmp_path / "a_file").write_text("occupied")
    (tmp_path / "zero.json").write_text('{"schema": "servelab.linear_cost_model", "version": 2, "coefficients": '
                                        '{"c_step": 0, "c_token": 0, "c_decode_ctx": 0, "c_prefill_attn": 0, '
                                        '"c_row": 0}}')
    (tmp_path / "string.jsonl").write_text('{"timestamp": "350", "input_length": 5, "output_length": 3, '
                                           '"hash_ids": []}\n')


CASES = [  # (arguments, text the one error line must contain)
    (["simulate", "-w", SMALL, "-p", "sjf:order=ljf"], "policy 'sjf': unknown parameter(s) ['order']"),
    (["simulate", "-w", SMALL, "-p", "priority:order=fcfs"], "policy 'priority': unknown parameter(s) ['order']"),
    (["simulate", "-w", SMALL, "-p", "vllm:order=sjf,order=fcfs"], "parameter 'order' given twice"),
    (["simulate", "-w", SMALL, "--slo", "ttft:2,ttft:3"], "--slo 'ttft:2,ttft:3': 'ttft' given twice"),
    (["simulate", "-w", SMALL, "--slo", "ttft:nan"], "--slo 'ttft:nan'"),
    (["simulate", "-w", SMALL, "-p", "static:max_wait_s=inf"], "policy 'static' parameter 'max_wait_s'"),
    (["simulate", "-w", SMALL, "-p", "static:max_wait_s=nan"], "policy 'static' parameter 'max_wait_s'"),
    (["simulate", "-w", SMALL, "-p", "distserve:num_prefill=abc", "-n", "2"], "parameter 'num_prefill'"),
    (["simulate", "-w", SMALL, "-p", "static:batch_size=100000000000"], "parameter 'batch_size'"),
    (["simulate", "-w", "burst:n=100000000000,prompt=fixed(8),output=fixed(2)"], "n must be in [1, 10,000,000]"),
    (["simulate", "-w", "burst:n=4,prompt=fixed(1e30),output=fixed(2)"], "'fixed(1e30)'"),
    (["simulate", "-w", "azure-conv:window=-100--50"], "window=-100--50: needs 0 <= START < END"),
    (["simulate", "-w", "poisson:rate=inf,n=4,prompt=fixed(8),output=fixed(2)"], "rate must be a finite number"),
    (["simulate", "-w", "mooncake:path={tmp}/true.jsonl"], "true.jsonl:1: input_length must be an integer"),
    (["simulate", "-w", "gsm8k:path={tmp}/latin1.jsonl"], "latin1.jsonl:1: not UTF-8 text"),
    (["simulate", "-w", "azure-conv:path={tmp}/huge.csv"], "huge.csv:2: ContextTokens must be in [1, 100,000,000]"),
    (["simulate", "-w", SMALL, "--cost-model", "{tmp}/cost.json"], "cost.json: coefficient c_token must be a finite"),
    (["simulate", "-w", SMALL, "--cost-model", "{tmp}/binary.json"], "binary.json: not UTF-8 text"),
    (["simulate", "-w", SMALL, "-n", "100000"], "num_instances must be in [1, 4096]"),
    (["simulate", "-w", SMALL, "--seed", "-1"], "seed must be in [0, 2**63 - 1], got -1"),
    (["simulate", "-w", SMALL, "--tp", "3"], "tp=3"),
    (["simulate", "-w", SMALL, "--gpu", "B300"], "unknown GPU 'B300'"),
    (["simulate", "-w", SMALL, "--out", "/proc/servelab-x"], "--out /proc/servelab-x: cannot create"),
    (["simulate", "-w", SMALL, "--out", "{tmp}/a_file"], "a_file: exists and is not a folder"),
    (["sweep", "-w", SMALL, "--rates", ""], "sweep needs at least one rate"),
    (["sweep", "-w", SMALL, "--policies", " , "], "sweep needs at least one policy"),
    (["sweep", "-w", SMALL, "--rates", "2,x"], "--rates: expected comma-separated numbers"),
    (["sweep", "-w", SMALL, "--rates", "1"], "cannot set the rate of a workload of 4 request(s) that all arrive"),
    (["capacity", "-w", SMALL, "--slo", ""], "capacity needs an SLO with at least one target"),
    (["capacity", "-w", SMALL, "--lo", "nan"], "lo must be a finite rate > 0"),
    (["analyze", "multibin", "--k-max", "100000"], "--k-max must be in [1, 256]"),
    (["analyze", "multibin", "--eps", "1e-300"], "use a larger eps"),
    # issue 22: accepted without a word, tracebacks after the run, vague messages
    (["simulate", "-w", SMALL, "-p", "multibin:edges=5;3;1"], "edges: bin boundaries must be non-decreasing"),
    (["simulate", "-w", SMALL, "-p", "multibin:edges=1;3;5"], "edges are used only with boundaries=explicit"),
    (["simulate", "-w", SMALL, "-p", "multibin:mu=-1"], "mu must be a finite rate > 0"),
    (["simulate", "-w", SMALL, "-p", "vllm-pp:num_stages=3", "-n", "2"], "3 pipeline stages need at least 3 instances"),
    (["simulate", "-w", SMALL, "-p", "static:max_wait_s=1e300"], "'max_wait_s': a duration of at most 3600 s"),
    (["simulate", "-w", SMALL, "-p", "infercept:host_gb=-1"], "preset 'infercept' parameter 'host_gb'"),
    (["simulate", "-w", SMALL, "--max-num-batched-tokens", "50"], "of 50 must be >= --max-num-seqs (max_num_seqs) of 256"),
    (["simulate", "-w", "burst:n=4,prompt=fixed(8),output=fixed(10),max_total=5"], "max_total=5 truncates prompts only"),
    (["simulate", "-w", "azure-conv:path="], "path= is empty"),
    (["simulate", "-w", "poisson:rate=1,n=3,lengths=" + "mix(" * 2000 + "alpaca" + ":1)" * 2000],
     "mix(...) nested more than 8 deep"),
    (["simulate", "-w", SMALL, "--trace", "{tmp}"], "--trace {tmp}: is a folder"),
    (["simulate", "-w", SMALL, "--trace", "/proc/forbidden/x.json"], "--trace /proc/forbidden: cannot create"),
    (["simulate", "-w", SMALL, "--watchdog", "events=-1"], "--watchdog 'events=-1'"),
    (["simulate", "-w", SMALL, "--cost-model", "{tmp}/zero.json"], "zero.json: c_step, c_token and c_row are all 0"),
    (["simulate", "-w", "mooncake:path={tmp}/string.jsonl"], "string.jsonl:1: timestamp must be a JSON number"),
    (["analyze", "multibin", "--mu", "nan"], "--mu must be a finite number > 0, got nan"),
    (["analyze", "multibin", "--distribution", "exponential", "--eps", "1"], "--eps applies to --distribution uniform"),
]


@pytest.mark.parametrize("args, expected", CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, args, expected):
    _files(tmp_path)
    monkeypatch.chdir(tmp_path)  # default output folders land here
    args = [a.replace("{tmp}", str(tmp_path)) for a in args] + ["--data-dir", str(tiny_data_dir())] * (
        args[0] in ("simulate", "sweep", "capacity"))
    expected = expected.replace("{tmp}", str(tmp_path))
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert expected in lines[0]
    assert "Traceback" not in res.output and not res.stdout.strip()


def test_option_type_errors_are_typer_usage_errors_without_a_traceback():
    res = CliRunner().invoke(app, ["simulate", "-n", "abc"])
    assert res.exit_code == 2 and "Traceback" not in res.output and "Invalid value" in res.output
