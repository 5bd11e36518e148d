"""The measured terms beside the operator tables: collectives, links, CPU overhead, held-out errors."""

import numpy as np
import pytest

from servelab.catalog.instance import InstanceSpec
from servelab.cluster.links import fitted_link_figures
from servelab.costmodel.collectives import MeasuredLink, all_reduce_table, send_recv_table
from servelab.costmodel.cpu_overhead import cpu_overhead_for
from servelab.costmodel import CostOptions, build_cost_model


def test_measured_link_reads_its_table_and_costs_nothing_for_nothing(data_dir):
    table = send_recv_table("a100", "nvlink", str(data_dir))
    link = MeasuredLink(200e9, 1e-5, table)
    assert link.transfer_time_s(0) == 0.0
    sizes = [1e3, 1e5, 1e7, 1e9]
    times = [link.transfer_time_s(s) for s in sizes]
    assert times == [float(table.time_s(s)) for s in sizes] and times == sorted(times)
    assert MeasuredLink(200e9, 1e-5).transfer_time_s(2e9) == pytest.approx(1e-5 + 0.01)


def test_the_topology_hands_off_kv_over_measured_links():
    links = fitted_link_figures("A100-80GB")
    assert isinstance(links["nvlink"], MeasuredLink) and links["nvlink"].table is not None
    cost = build_cost_model(InstanceSpec("A100-80GB", "Llama-2-7B"), CostOptions())
    one_mb_tokens = 2  # Llama-2-7B: 512 KiB of KV per token
    assert cost.kv_transfer_time_s(one_mb_tokens, links["nvlink"]) == pytest.approx(
        float(links["nvlink"].table.time_s(2 * 512 * 1024)))


def test_a_slower_nvlink_reads_the_table_at_a_larger_size(data_dir):
    fast = all_reduce_table("h100", 4, str(data_dir))
    slow = all_reduce_table("h100", 4, str(data_dir), 2.25)
    assert float(slow.time_s(64e6)) > 1.8 * float(fast.time_s(64e6))
    assert all_reduce_table("h100", 16, str(data_dir)) is None  # beyond one node: the caller's ring formula


def test_overhead_picks_the_nearest_measured_entry_and_says_what_it_borrowed(data_dir):
    llama13 = cpu_overhead_for("measured", "A100-80GB", 13e9, 2, data_dir)
    assert "internlm/internlm-20b at TP 2" in llama13.detail and llama13.at(8) > 5e-3  # Ray at TP 2
    h100 = cpu_overhead_for("measured", "H100-80GB", 7e9, 1, data_dir)
    assert "borrowed" in h100.detail and h100.at(64) == pytest.approx(3.5e-3, rel=0.03)
    off = cpu_overhead_for("off", "A100-80GB", 7e9, 1, data_dir)
    assert off.at(64) == 0.0 and off.dense(3) == [0.0] * 4


def test_held_out_tables_beat_the_roofline_fit(data_dir):
    from servelab.costmodel.heldout import OpErrors, points_held_out, pooled

    errors = pooled(points_held_out("a40", "A40", data_dir))
    table_median, table_p90 = OpErrors.summary(errors.profile)
    roofline_median, _ = OpErrors.summary(errors.roofline)
    assert table_median < 0.03 and table_p90 < 0.08 and table_median < roofline_median
    assert np.all(errors.profile >= 0)


def test_a_widened_measured_link_splits_the_bytes_over_its_lanes():
    from servelab.cluster.links import _widen

    link = fitted_link_figures("H100-80GB")["nvlink"]
    four = _widen(link, 4)
    assert four.lanes == 4 and four.transfer_time_s(4e8) == pytest.approx(link.transfer_time_s(1e8))
