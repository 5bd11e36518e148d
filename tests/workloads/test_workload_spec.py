import numpy as np
import pytest

from servelab.core.request import SLO, ServiceClass
from servelab.workloads import WorkloadError, describe, mean_rate_per_s, parse_spec, parse_workload
from servelab.workloads.workload import arrival_times


@pytest.mark.parametrize("text", [
    "azure-conv",
    "azure-conv:rate=2.0,window=0-600,n=1000",
    "gamma:rate=5,cv=3,n=1000,prompt=uniform(32,512),output=exp(200)",
    "poisson:rate=2,n=50,lengths=mix(alpaca:0.7,longbench:0.3),slo=ttft:2,tpot:0.1,offline=0.2",
    "burst:n=256,prompt=fixed(128),output=uniform(1,1024),priority=0:0.8,1:0.2",
])
def test_spec_string_round_trips(text):
    parsed = parse_spec(text)
    assert str(parsed) == text
    assert parse_spec(str(parsed)) == parsed


def test_parse_spec_splits_options():
    parsed = parse_spec("poisson:rate=2,n=50,prompt=uniform(32,512),output=exp(200),slo=ttft:2,tpot:0.1")
    assert parsed.options == (("rate", "2"), ("n", "50"), ("prompt", "uniform(32,512)"),
                              ("output", "exp(200)"), ("slo", "ttft:2,tpot:0.1"))


def test_azure_conv_window_head_and_rate(data_dir):
    workload = parse_workload("azure-conv:rate=2.0,window=0-600,n=1000", data_dir, seed=0)
    assert len(workload) == 1000 and workload[0].arrival_time_s == 0.0
    assert mean_rate_per_s(workload) == pytest.approx(2.0)
    scaled = parse_workload("azure-code:scale=0.5,n=100", data_dir, seed=0)
    original = parse_workload("azure-code:n=100", data_dir, seed=0)
    assert np.allclose(arrival_times(scaled), 2 * arrival_times(original))


def test_synthetic_specs(data_dir):
    workload = parse_workload("gamma:rate=5,cv=3,n=1000,prompt=uniform(32,512),output=exp(200)", data_dir, seed=1)
    stats = describe(workload)
    assert stats.num_requests == 1000 and 32 <= stats.prompt_p50 <= 512
    assert stats.rate_per_s == pytest.approx(5, rel=0.3)
    burst = parse_workload("burst:n=256,prompt=fixed(128),output=uniform(1,1024)", data_dir, seed=1)
    assert arrival_times(burst).max() == 0.0 and {s.num_prompt_tokens for s in burst} == {128}
    assert parse_workload("poisson:rate=5,n=20,lengths=alpaca", data_dir, 7) == \
        parse_workload("poisson:rate=5,n=20,lengths=alpaca", data_dir, 7)


def test_attrs_from_spec(data_dir):
    workload = parse_workload("poisson:rate=2,n=400,lengths=mix(alpaca:0.7,longbench:0.3),"
                              "slo=ttft:2,tpot:0.1,offline=0.5,priority=0:1,3:1", data_dir, seed=0)
    online = [s for s in workload if s.service_class is ServiceClass.ONLINE]
    assert 100 < len(online) < 300 and all(s.slo == SLO(ttft_s=2.0, tpot_s=0.1) for s in online)
    assert {s.priority for s in workload} == {0, 3}
    assert max(s.num_prompt_tokens for s in workload) > 2000  # the longbench share is there


def test_dataset_specs(data_dir):
    gsm = parse_workload("gsm8k:rate=4,n=500", data_dir, seed=0)
    assert len(gsm) == 500 and all(s.prompt_text for s in gsm)
    assert len({s.prompt_text for s in gsm}) == 500  # distinct questions while n <= rows
    arxiv = parse_workload("arxiv:rate=1,cv=2", data_dir, seed=0)
    assert len(arxiv) == 28_257 and describe(arxiv).rate_per_s == pytest.approx(1.0, rel=0.05)
    trace_lengths = parse_workload("burst:n=10,lengths=mooncake", data_dir, seed=0)
    assert len(trace_lengths) == 10
    # a synthetic workload without lengths gets the alpaca preset's (same draws as naming it)
    default = parse_workload("poisson:rate=2,n=50", data_dir, seed=3)
    named = parse_workload("poisson:rate=2,n=50,lengths=alpaca", data_dir, seed=3)
    assert [(s.num_prompt_tokens, s.num_output_tokens) for s in default] == \
        [(s.num_prompt_tokens, s.num_output_tokens) for s in named]


@pytest.mark.parametrize("text, message", [
    ("azure", r"unknown source 'azure'; valid: \['arxiv', 'azure-code'"),
    ("azure-conv:speed=2", r"unknown key 'speed' for azure-conv; valid: \['path', 'window'"),
    ("poisson:rate=2,n=10,prompt=fixed(5)", r"needs both prompt=DIST and output=DIST \(or lengths=SOURCE"),
    ("poisson:n=10,lengths=alpaca", "poisson needs rate="),
    ("poisson:rate=2,n=10,prompt=uniform(512,32),output=fixed(1)", "uniform needs 1 <= lo <= hi"),
    ("poisson:rate=2,n=10,prompt=normal(5),output=fixed(1)", r"unknown length distribution 'normal'"),
    ("poisson:rate=2,n=10,prompt=fixed(1,2),output=fixed(1)", r"fixed\(\) takes 1 numbers"),
    ("poisson:rate=2,n=10,lengths=sharegpt", r"unknown length source 'sharegpt'; valid: \['alpaca'"),
    ("poisson:rate=-1,n=10,lengths=alpaca", "rate must be > 0"),
    ("burst:n=ten,lengths=alpaca", "n must be an integer"),
    ("burst:n=5,lengths=alpaca,slo=ttft:2,latency:3", "slo= .*expected ttft:V,tpot:V,tbt:V,e2el:V"),
    ("azure-conv:rate=2,scale=3", "give rate= or scale=, not both"),
    ("azure-conv:window=600", "window= expects START-END"),
    ("azure-conv:n=5,n=6", "key 'n' given twice"),
    ("burst:n=5,prompt=fixed(3,output=fixed(1)", r"unbalanced '\('"),
    ("burstgpt", "no such file"),
])
def test_bad_specs_raise_clear_errors(data_dir, text, message):
    with pytest.raises(WorkloadError, match=message):
        parse_workload(text, data_dir, seed=0)


def test_burstgpt_spec_with_path(data_dir, write_file):
    path = write_file("b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                               "0,GPT-4,10,5,15,API log\n4,GPT-4,20,0,20,API log\n8,ChatGPT,30,6,36,API log\n")
    workload = parse_workload(f"burstgpt:path={path},zero=clamp,model=GPT-4,scale=2", data_dir, seed=0)
    assert [(s.arrival_time_s, s.num_output_tokens) for s in workload] == [(0.0, 5), (2.0, 1)]
