"""scripts/scale_attribution.py: profiled functions are grouped into the simulator's parts, a
built-in's CPU is charged to its callers' parts in proportion to what each spent, the parts add
up to the whole profile, and the verdict names the part that grew most."""

from __future__ import annotations

import pytest
from simkit import load_script


@pytest.fixture(scope="module")
def attr():
    return load_script("scale_attribution")


@pytest.mark.parametrize("func, part", [
    ("cluster/driver.py:106(run)", "event loop and heap"),
    ("cluster/driver.py:144(_dispatch)", "event loop and heap"),
    ("core/events.py:31(push)", "event loop and heap"),
    ("cluster/driver.py:203(_on_arrival)", "arrivals and routing"),
    ("cluster/load_index.py:70(_refresh)", "arrivals and routing"),
    ("baselines/routers.py:24(on_arrival)", "arrivals and routing"),
    ("metrics/collector.py:202(record_step)", "metrics"),
    ("cluster/driver.py:342(_on_step_done)", "instance step path"),
    ("core/kv_blocks.py:187(extend_tables)", "instance step path"),
    ("baselines/vllm.py:83(schedule)", "instance step path"),
    ("fromnumeric.py:48(_wrapfunc)", "other"),
])
def test_part_of(attr, func, part):
    assert attr.part_of(func) == part


def _profile(instances, funcs, callers, tokens=1_000_000):
    return {"instances": instances, "output_tokens": tokens, "funcs": funcs, "builtin_callers": callers}


def test_builtins_are_charged_to_their_callers_and_parts_add_up(attr):
    pop = "~:0(<built-in method _heapq.heappop>)"
    funcs = {"cluster/driver.py:106(run)": (10, 0.001), "cluster/load_index.py:50(least_loaded)": (100, 0.002),
             "core/instance.py:75(apply)": (1_000, 0.010), pop: (400, 0.004)}
    # heappop: 3 ms from the event loop, 1 ms from the load index
    callers = {pop: {"cluster/driver.py:106(run)": 0.003, "cluster/load_index.py:50(least_loaded)": 0.001}}
    parts = attr.parts_per_token(_profile(1, funcs, callers))
    assert parts["event loop and heap"][1] == pytest.approx((0.001 + 0.003) / 1e6 * 1e9)
    assert parts["arrivals and routing"][1] == pytest.approx((0.002 + 0.001) / 1e6 * 1e9)
    assert parts["instance step path"][1] == pytest.approx(0.010 / 1e6 * 1e9)
    total = sum(own for _, own in funcs.values()) / 1e6 * 1e9
    assert sum(v[1] for v in parts.values()) == pytest.approx(total)
    # the built-in's calls split in the same proportion
    ev = parts["event loop and heap"][0][f"{pop} from cluster/driver.py:106(run)"]
    assert ev[0] == pytest.approx(400 * 0.75 / 1e6 * 1e3)


def test_verdict_names_the_part_that_grew_most(attr):
    step, heap = "cluster/driver.py:342(_on_step_done)", "cluster/driver.py:144(_dispatch)"
    one = _profile(1, {step: (10_000, 0.010), heap: (10_000, 0.001)}, {})
    many = _profile(32, {step: (10_000, 0.011), heap: (10_000, 0.004)}, {})
    plain = [{"instances": n, "tokens_per_cpu_s": s, "records_per_ktok": 10.0, "gc_cpu_s": g, "cpu_s": 1.0,
              "output_tokens": 1_000_000, "load": [1.0, 1.0]} for n, s, g in ((1, 1e6, 0.01), (32, 8e5, 0.02))]
    text = "\n".join(attr.attribution_lines([one, many], plain))
    assert "the largest part of it is the event loop and heap (+3 ns, 75% of the growth)" in text
    assert "instance step path +1" in text
    assert "of which the cyclic GC +10 ns" in text
