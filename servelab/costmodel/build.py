"""Builds one instance's cost model from ``CostOptions``: the profile-driven model or the
roofline. Kept apart from ``options`` so the options stay a leaf that every model may import."""

from __future__ import annotations

import functools

from servelab.costmodel.options import CostOptions


@functools.lru_cache(maxsize=256)
def build_cost_model(spec, options: CostOptions = CostOptions()):
    """The cost model of one ``InstanceSpec`` under ``options``; cached, so the instances of a
    group (identical specs) share one model and its precomputed tables."""
    if options.op_times == "roofline":
        from servelab.costmodel.roofline import roofline_for_instance

        return roofline_for_instance(spec)
    from servelab.costmodel.profiled import profiled_for_instance

    return profiled_for_instance(spec, options)
