"""Step cost models: how long a step of a given shape takes on an instance.

``profile`` (measured operator tables, a named attention kernel, measured collectives and
per-step CPU overhead; the simulator's default), ``roofline`` (analytical, fitted to kernel
profiles) and ``linear`` (fitted to wall-clock steps, loaded from JSON) all satisfy
``base.CostModel`` and are registered by name. ``CostOptions`` says how a run builds them.
"""

from servelab.costmodel.base import COST_MODELS, CostModel, make_cost_model, register_cost_model
from servelab.costmodel.fitting import FitError
from servelab.costmodel.linear import LinearCostModel, fit_linear_cost_model
from servelab.costmodel.links import LinkSpec, fit_send_recv
from servelab.costmodel.build import build_cost_model
from servelab.costmodel.options import CostOptions
from servelab.costmodel.ops import OpEfficiency, RooflineParams
from servelab.costmodel.profiled import ProfiledCostModel, profiled_for_instance
from servelab.costmodel.profile_fit import FitReport, fit_profile, fitted_params, params_for_gpu
from servelab.costmodel.roofline import RooflineCostModel, roofline_for

__all__ = [
    "COST_MODELS", "CostModel", "make_cost_model", "register_cost_model", "FitError", "LinearCostModel",
    "fit_linear_cost_model", "LinkSpec", "fit_send_recv", "OpEfficiency", "RooflineParams", "FitReport",
    "fit_profile", "fitted_params", "params_for_gpu", "RooflineCostModel", "roofline_for", "CostOptions",
    "build_cost_model", "ProfiledCostModel", "profiled_for_instance",
]
