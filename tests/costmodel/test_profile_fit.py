"""Fit the roofline to Vidur's measured kernel times (shared/data/profiling)."""

import numpy as np
import pytest

from servelab.catalog.gpus import get_gpu
from servelab.costmodel.ops import GEMM_OPS, RooflineParams
from servelab.paths import default_data_dir
from servelab.costmodel.profile_fit import (
    IDEAL,
    fit_profile,
    fitted_params,
    load_profile,
    predict_s,
)

PROFILING = default_data_dir() / "profiling"
A100_7B = PROFILING / "a100" / "Llama-2-7b-hf_mlp.csv"
# Fitted per-GEMM median errors on A100 Llama-2-7B measure 4.6-6.7%. What is left is cuBLAS
# tile and wave quantisation (time steps at multiples of 128 tokens between ~100 and 300
# tokens) and small TP=8 kernels whose weights stay in L2, which a three-parameter roofline
# cannot follow. 10% is 1.5x the worst measured median: a broken fit lands at 30%+.
MEDIAN_BOUND = 0.10


@pytest.fixture(scope="module")
def report():
    return fit_profile(A100_7B, "A100-80GB")


def test_fitted_gemms_beat_the_unfitted_roofline(report):
    print("\n" + report.table())
    gpu, samples = get_gpu("A100-80GB"), load_profile(A100_7B)
    for op in GEMM_OPS[:4]:
        fit = report.op(op)
        assert fit.fitted.median_rel_error < MEDIAN_BOUND, op
        assert fit.fitted.median_rel_error < fit.ideal.median_rel_error / 3, op
        assert fit.fitted.p90_rel_error <= fit.default.p90_rel_error, op

        def mean_abs_log(eff):
            return np.mean(np.abs(np.log(predict_s(samples[op], eff, gpu) / samples[op].time_s)))

        # the fit's objective is no worse than the defaults or the ideal roofline
        assert mean_abs_log(fit.efficiency) <= min(mean_abs_log(RooflineParams().op(op)), mean_abs_log(IDEAL))
        assert 0.5 < fit.efficiency.compute < 0.9  # large GEMMs: 60-75% of the 312 TFLOPS peak


def test_elementwise_ops_are_fitted_as_memory_bound(report):
    for op in ("norm", "rope", "act", "add", "embed"):
        fit = report.op(op)
        assert fit.efficiency.compute == 1.0
        assert fit.fitted.median_rel_error < fit.default.median_rel_error


def test_family_params_cover_every_profiled_op():
    params = fitted_params("A100-80GB")
    assert {name for name, _ in params.per_op} >= set(GEMM_OPS[:4]) | {"norm", "rope", "act", "add", "embed"}
    assert "a100_dgx_send_recv.csv" in params.source
    assert 0.5 < params.comm_efficiency < 1.1 and 0 < params.comm_latency_s < 50e-6
    assert fitted_params("H100-80GB").per_op != params.per_op


def test_non_profile_files_are_rejected():
    with pytest.raises(ValueError, match="not an MLP profile"):
        load_profile(PROFILING / "a100_dgx_send_recv.csv")
