import numpy as np
import pytest

from servelab.workloads import (EmpiricalLengths, Exponential, Fixed, IndependentLengths, LengthTable, LogNormal,
                                MixtureLengths, Uniform, alpaca_like, longbench_like)
from servelab.workloads.spec import parse_length_dist

N = 40_000


def rng(seed=0):
    return np.random.default_rng(seed)


def test_fixed_and_uniform():
    assert Fixed(128).sample(3, rng()).tolist() == [128, 128, 128]
    values = Uniform(32, 512).sample(N, rng())
    assert values.min() == 32 and values.max() == 512
    assert values.mean() == pytest.approx(272, rel=0.02)


def test_exponential_mean_and_clip():
    values = Exponential(200).sample(N, rng())
    assert values.min() >= 1 and values.dtype == np.int64
    assert values.mean() == pytest.approx(200, rel=0.03)
    assert values.std() / values.mean() == pytest.approx(1.0, rel=0.05)
    assert Exponential(200, 300).sample(N, rng()).max() == 300


def test_lognormal_median_sigma_and_from_mean():
    values = LogNormal(500, 1.0).sample(N, rng())
    assert np.median(values) == pytest.approx(500, rel=0.04)
    assert np.log(values).std() == pytest.approx(1.0, rel=0.04)
    from_mean = LogNormal.from_mean(300, 0.5).sample(N, rng(1))
    assert from_mean.mean() == pytest.approx(300, rel=0.03)
    assert LogNormal(500, 1.0, 800).sample(N, rng()).max() == 800


@pytest.mark.parametrize("dist", [Fixed(7), Uniform(1, 1024), Exponential(200), Exponential(1.5, 4096),
                                  LogNormal(83, 0.6), LogNormal(64.25, 0.8, 512)])
def test_dist_string_round_trip(dist):
    assert parse_length_dist(str(dist)) == dist


def test_independent_lengths_truncate_prompt_to_context():
    source = IndependentLengths(Fixed(5000), Uniform(1, 600), max_total_tokens=4096)
    table = source.sample(1000, rng())
    total = table.num_prompt_tokens + table.num_output_tokens
    assert total.max() == 4096 and table.num_output_tokens.max() > 500


def test_presets_match_their_documented_statistics():
    alpaca = alpaca_like().sample(N, rng())
    assert alpaca.num_prompt_tokens.mean() == pytest.approx(83, rel=0.05)
    assert alpaca.num_output_tokens.mean() == pytest.approx(270, rel=0.05)
    longbench = longbench_like().sample(N, rng())
    total = longbench.num_prompt_tokens + longbench.num_output_tokens
    assert total.max() <= 4096 and np.median(total) > 3000
    assert longbench.num_output_tokens.max() <= 512


def test_empirical_lengths_sample_rows_jointly():
    table = LengthTable(np.array([10, 20, 30]), np.array([1, 2, 3]), ("a", "b", "c"), "tiny")
    drawn = EmpiricalLengths(table).sample(3, rng())
    assert sorted(drawn.num_prompt_tokens.tolist()) == [10, 20, 30]  # without replacement while n <= rows
    assert np.array_equal(drawn.num_prompt_tokens, drawn.num_output_tokens * 10)
    assert [t for t in drawn.prompt_texts] == [" abc"[p // 10] for p in drawn.num_prompt_tokens]
    assert len(EmpiricalLengths(table).sample(10, rng())) == 10  # with replacement beyond
    with pytest.raises(ValueError, match="without replacement"):
        EmpiricalLengths(table, replace=False).sample(4, rng())


def test_mixture_weights_and_texts():
    texts = LengthTable(np.array([7]), np.array([7]), ("q",), "one")
    mix = MixtureLengths((IndependentLengths(Fixed(100), Fixed(1)), EmpiricalLengths(texts, replace=True)), (0.7, 0.3))
    table = mix.sample(N, rng())
    share = np.mean(table.num_prompt_tokens == 100)
    assert share == pytest.approx(0.7, abs=0.01)
    assert all((t == "q") == (p == 7) for t, p in zip(table.prompt_texts[:200], table.num_prompt_tokens[:200]))


def test_invalid_dists_raise():
    for make in (lambda: Fixed(0), lambda: Uniform(5, 2), lambda: Exponential(-1), lambda: LogNormal(10, -1),
                 lambda: MixtureLengths((), ()), lambda: LengthTable(np.array([0]), np.array([1]))):
        with pytest.raises(ValueError):
            make()
