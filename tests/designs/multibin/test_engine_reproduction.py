"""Figures 5 and 7 on the real engine, at toy size: every run finishes and the report is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servelab.designs.multibin.binning import BinEdges
from servelab.engine.tiny_model import gsm8k_texts, make_tiny_model, train_tokenizer
from servelab.designs.multibin.reproduce.engine import gsm8k_requests, multibin_policy
from servelab.designs.multibin.reproduce.engine_run import REPRODUCTION, EngineSizes
from servelab.designs.multibin.reproduce.engine_summary import engine_rows, engine_section, load_engine_summary
from servelab.reproduce.runner import run_reproduction


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    tokenizer = train_tokenizer(gsm8k_texts(limit=500), vocab_size=512)
    return make_tiny_model(tmp_path_factory.mktemp("mb-engine") / "tiny", tokenizer=tokenizer)


@pytest.mark.slow
def test_engine_reproduction_small(tiny_model_dir, tmp_path):
    sizes = EngineSizes(num_requests=16, ks=(1, 2), max_tokens=48, fig5_tokens=(4, 8, 16), fig5_repeats=1)
    result = run_reproduction(REPRODUCTION, tmp_path, sizes=sizes, seed=0, options={"model": tiny_model_dir})
    fit = result["fig5"]["fit"]
    assert fit.model.per_token_s > 0 and fit.num_points == 3
    assert [row["k"] for row in result["fig7"]] == [1, 2]
    for row in result["fig7"]:
        assert row["engine_req_s"] > 0 and row["engine_tok_s"] > 0
        assert row["token_sim_tok_s"] > 0 and row["queue_sim_tok_s"] > 0 and row["calibrated_sim_tok_s"] > 0
        assert row["num_batches"] >= 2  # 16 requests in batches of 8
        # every request finished (run_engine raises otherwise): 16 requests over the measured duration
        assert row["engine_req_s"] * row["engine_duration_s"] == pytest.approx(16, rel=1e-6)
    # the two simulators agree on the same requests with the same line (padded batches, t = 0 burst)
    assert result["fig7"][1]["token_sim_tok_s"] == pytest.approx(result["fig7"][1]["queue_sim_tok_s"], rel=1e-6)
    text = (tmp_path / "multibin_engine.md").read_text()
    assert "Figure 5" in text and "Figure 7" in text and "measured" in text
    assert "servelab reproduce multibin-engine --num-requests 16" in text
    assert (tmp_path / "multibin" / "fig5_fig7_engine.png").stat().st_size > 0
    summary = json.loads((tmp_path / "multibin_engine.json").read_text())
    assert summary["fit"]["per_token_s"] > 0 and [row["k"] for row in summary["fig7"]] == [1, 2]
    assert summary["full_size_line"]["num_requests"] == 7473 and all(t > 0 for t in summary["full_size_line"]["tok_s"])
    # multibin.md quotes the JSON: a measured section and two paper-vs-ours rows
    loaded = load_engine_summary(tmp_path / "multibin_engine.json")
    section = engine_section(loaded)
    assert section.startswith("## Figure 5 and Figure 7 on our engine (measured)") and "| 2 |" in section
    assert [row[0].split(":")[0] for row in engine_rows(loaded)] == ["Fig. 5", "Fig. 7 on a real engine"]
    assert load_engine_summary(tmp_path / "missing.json") is None and engine_section(None) == ""


def test_gsm8k_requests_caps_and_seeds(tiny_model_dir):
    from servelab.engine.loader import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    a = gsm8k_requests(tok, 8, seed=3, max_tokens=20)
    assert a == gsm8k_requests(tok, 8, seed=3, max_tokens=20)
    assert all(1 <= s.num_output_tokens <= 20 and s.prompt_token_ids for s in a)
    with pytest.raises(ValueError, match="num_requests"):
        gsm8k_requests(tok, 0, seed=0, max_tokens=20)


def test_multibin_policy_spec_parses():
    from servelab.core.policy import POLICIES
    from servelab.core.registry import parse_name_params

    for edges in (BinEdges(()), BinEdges((40.5, 90.0, 150.25))):
        name, params = parse_name_params(multibin_policy(edges, 8))
        policy = POLICIES.create(name, params)
        assert policy.config.num_bins == edges.num_bins and tuple(policy.config.edges) == edges.inner
