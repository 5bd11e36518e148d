"""Sampling: greedy, masks, seeded determinism independent of batch composition."""

from __future__ import annotations

import pytest
import torch

from servelab.engine.sampling import GREEDY, Sampler, SamplingParams, finish_reason, top_k_top_p_mask


def _logits(rows=4, vocab=50, seed=0):
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_params_are_validated():
    for bad in (dict(temperature=-1), dict(top_k=-1), dict(top_p=0), dict(top_p=1.5), dict(max_tokens=0),
                dict(stop=("",))):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    with pytest.raises(TypeError):
        SamplingParams(stop="x")


def test_greedy_is_argmax():
    logits = _logits()
    assert Sampler().sample(logits, [0, 1, 2, 3], [GREEDY] * 4) == logits.argmax(-1).tolist()


def test_top_k_mask_keeps_exactly_k_largest():
    logits = _logits()
    masked = top_k_top_p_mask(logits, torch.tensor([1, 5, 0, 50]), torch.ones(4))
    for row, k in enumerate([1, 5, 50, 50]):
        kept = torch.isfinite(masked[row]).nonzero().flatten()
        assert set(kept.tolist()) == set(logits[row].topk(k).indices.tolist())
        assert torch.equal(masked[row, kept], logits[row, kept])


def test_top_p_mask_is_smallest_set_reaching_p():
    logits = _logits()
    top_p = torch.tensor([0.1, 0.5, 0.9, 1.0])
    masked = top_k_top_p_mask(logits, torch.zeros(4, dtype=torch.long), top_p)
    for row in range(4):
        probs, order = logits[row].softmax(-1).sort(descending=True)
        n = int((probs.cumsum(0) < top_p[row] - 1e-7).sum()) + 1  # first prefix whose mass reaches p
        n = min(n, len(probs))
        assert set(torch.isfinite(masked[row]).nonzero().flatten().tolist()) == set(order[:n].tolist())


def test_samples_stay_inside_the_mask():
    logits = _logits(rows=1, vocab=50).repeat(200, 1)
    params = [SamplingParams(temperature=1.0, top_k=3)] * 200
    tokens = Sampler(seed=1).sample(logits, list(range(200)), params)
    allowed = set(logits[0].topk(3).indices.tolist())
    assert set(tokens) <= allowed and len(set(tokens)) > 1


def test_sampling_follows_the_distribution():
    logits = torch.tensor([[0.0, 1.0, 2.0]]).repeat(4000, 1)
    tokens = torch.tensor(Sampler(seed=3).sample(logits, list(range(4000)), [SamplingParams()] * 4000))
    freq = torch.bincount(tokens, minlength=3).float() / 4000
    assert torch.allclose(freq, logits[0].softmax(-1), atol=0.03)


def test_seeded_requests_do_not_depend_on_the_batch():
    seeded = SamplingParams(temperature=0.8, top_p=0.9, seed=42)
    other = SamplingParams(temperature=1.0)
    alone, mixed = Sampler(seed=0), Sampler(seed=7)
    run_alone, run_mixed = [], []
    for step in range(10):
        logits = _logits(rows=3, seed=step)
        run_alone.append(alone.sample(logits[:1], [5], [seeded])[0])
        run_mixed.append(mixed.sample(logits[[1, 0, 2]], [8, 5, 9], [other, seeded, GREEDY])[1])
    assert run_alone == run_mixed
    again = Sampler(seed=0)
    assert [again.sample(_logits(rows=3, seed=s)[:1], [5], [seeded])[0] for s in range(10)] == run_alone
    again.release(5)
    assert again.sample(_logits(rows=3, seed=0)[:1], [5], [seeded])[0] == run_alone[0]


def test_finish_reason():
    p = SamplingParams(max_tokens=3, stop_token_ids=(9,))
    assert finish_reason(p, 1, 1, (1,)) == "eos"
    assert finish_reason(SamplingParams(ignore_eos=True), 1, 1, (1,)) is None
    assert finish_reason(p, 9, 1, (1,)) == "stop_token"
    assert finish_reason(p, 5, 2, (1,)) is None
    assert finish_reason(p, 5, 3, (1,)) == "length"
