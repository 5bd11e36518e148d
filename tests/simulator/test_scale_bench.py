"""servelab.simulator.scale_bench: the ratio to one instance is measured in the point's own
process, each run between two one-instance reference runs, and the references agree."""

from __future__ import annotations

import pytest

from servelab.simulator import scale_bench


def test_bracketed_ratios_divide_each_run_by_the_references_around_it():
    assert scale_bench.bracketed_ratios([1.0, 3.0], [1.0, 3.0, 3.0]) == pytest.approx([0.5, 1.0])
    with pytest.raises(ValueError, match="2 runs need 3 references"):
        scale_bench.bracketed_ratios([1.0, 3.0], [1.0, 3.0])


def test_run_with_reference_alternates_in_one_process(tmp_path):
    out = scale_bench.run_with_reference(2, 12, 5.5, rounds=2, reference_repeats=2, data_dir=tmp_path)
    ref = out["reference"]
    assert len(out["ratios"]) == 2 and len(out["cpu_runs"]) == 2
    assert len(ref["tokens_per_cpu_s"]) == 3 and ref["repeats"] == 2
    assert len(ref["fingerprints"]) == 2  # one per reference workload (seeds 0, 1)
    expected = scale_bench.bracketed_ratios(
        [out["output_tokens"] / c for c in out["cpu_runs"]], ref["tokens_per_cpu_s"])
    assert out["ratios"] == pytest.approx(expected)
    # the same point outside the bracket gives the same results
    alone = scale_bench.run_point(2, 12, 5.5, 1, tmp_path)
    assert alone["fingerprints"] == out["fingerprints"] and alone["output_tokens"] == out["output_tokens"]
