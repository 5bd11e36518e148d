"""The profile-fit cache: same answer as fitting, refits when a profile file changes."""

import pytest

from servelab.costmodel import fit_cache
from servelab.costmodel.ops import OpEfficiency, RooflineParams

PARAMS = RooflineParams(gemm=OpEfficiency(0.61234567890123, 0.7, 1.25e-6),
                        per_op=(("qkv_proj", OpEfficiency(0.5, 1.3, 0.0)),), comm_latency_s=3.3e-6, source="test")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVELAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SERVELAB_FIT_CACHE", raising=False)
    profile = tmp_path / "x_mlp.csv"
    profile.write_text("a,b\n1,2\n")
    calls = []

    def fit():
        calls.append(1)
        return PARAMS

    return profile, calls, fit


def test_json_round_trip_is_exact():
    assert fit_cache.from_json(fit_cache.to_json(PARAMS)) == PARAMS


def test_second_call_reads_the_cache(cache):
    profile, calls, fit = cache
    assert fit_cache.load_or_fit([profile], "fam", fit) == PARAMS
    assert fit_cache.load_or_fit([profile], "fam", fit) == PARAMS
    assert len(calls) == 1


def test_a_changed_profile_file_refits(cache):
    profile, calls, fit = cache
    fit_cache.load_or_fit([profile], "fam", fit)
    profile.write_text("a,b\n1,3\n")
    fit_cache.load_or_fit([profile], "fam", fit)
    assert len(calls) == 2


def test_a_corrupt_cache_file_refits_and_is_rewritten(cache, tmp_path):
    profile, calls, fit = cache
    fit_cache.load_or_fit([profile], "fam", fit)
    (stored,) = (tmp_path / "cache").glob("roofline-fam-*.json")
    stored.write_text("{truncated")
    assert fit_cache.load_or_fit([profile], "fam", fit) == PARAMS and len(calls) == 2
    assert fit_cache.load_or_fit([profile], "fam", fit) == PARAMS and len(calls) == 2


def test_disabled_or_unwritable_cache_still_answers(cache, monkeypatch, tmp_path):
    profile, calls, fit = cache
    monkeypatch.setenv("SERVELAB_FIT_CACHE", "0")
    fit_cache.load_or_fit([profile], "fam", fit)
    fit_cache.load_or_fit([profile], "fam", fit)
    assert len(calls) == 2 and not (tmp_path / "cache").exists()
    monkeypatch.setenv("SERVELAB_FIT_CACHE", "1")
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SERVELAB_CACHE_DIR", str(blocker / "sub"))  # cannot be created
    assert fit_cache.load_or_fit([profile], "fam", fit) == PARAMS


def test_cached_a100_fit_equals_the_fit(monkeypatch, tmp_path):
    """The real profiles: a cached run uses bit-identical parameters."""
    from servelab.costmodel.profile_fit import fitted_params

    monkeypatch.setenv("SERVELAB_CACHE_DIR", str(tmp_path))
    fitted = fitted_params("A100-80GB")
    assert fitted_params("A100-80GB", use_cache=True) == fitted  # miss: fits and stores
    assert fitted_params("A100-80GB", use_cache=True) == fitted  # hit
    assert len(list(tmp_path.glob("roofline-a100-*.json"))) == 1
