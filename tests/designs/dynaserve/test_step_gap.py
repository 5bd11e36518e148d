"""The planned-vs-simulated step gap test: its margin and its pooling over seeds."""

from servelab.designs.dynaserve.reproduce import step_gap


def _runs():
    inst = lambda p99, over: {"count": 10, "error_ms_p50": 1.0, "error_ms_p99": p99, "planned_ms_p50": 100.0,  # noqa: E731
                              "actual_ms_p50": 101.0, "actual_ms_p99": 100 + p99, "over_slo_share": over,
                              "planned_within_target_over_slo_share": over}
    return [{"seed": 0, "attainment": 0.3, "instances": [inst(14.2, 0.7), inst(21.3, 0.5)]},
            {"seed": 1, "attainment": 0.5, "instances": [inst(10.0, 0.4), {"count": 0}]}]


def test_pooled_means_over_seeds_and_instances_and_the_worst_p99():
    p = step_gap.pooled(_runs())
    assert p["mixed_steps"] == 30 and abs(p["over_slo_share"] - 1.6 / 3) < 1e-9
    assert p["error_ms_p99_max"] == 21.3 and abs(p["attainment"] - 0.4) < 1e-9


def test_the_margin_is_the_worst_p99_error_rounded_up():
    assert abs(step_gap.margin_headroom(step_gap.pooled(_runs()), 0.1) - 0.22) < 1e-9
    assert step_gap.margin_headroom({"error_ms_p99_max": None}, 0.1) == 0.0
    assert step_gap.margin_headroom({"error_ms_p99_max": -3.0}, 0.1) == 0.0
