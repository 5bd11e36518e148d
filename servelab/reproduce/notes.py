"""What a reproduction's simulated numbers were made with, in one phrase its reports share.

The simulator's default cost model became the profile-driven one (issue 23: measured operator
tables interpolated per model, GPU and TP, with the per-step CPU overhead measured on vLLM);
reports that still said "roofline" described a model their runs no longer used. A report that
really runs the roofline (a gap test, a motivation figure) says so where it does.
"""

DEFAULT_COST_MODEL = ("servelab's profile-driven cost model (measured operator tables scaled to the GPU "
                      "and model, per-step CPU overhead by batch size)")
DEFAULT_COST_MODEL_SHORT = "profile-driven cost model"
