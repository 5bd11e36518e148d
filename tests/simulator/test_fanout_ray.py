"""``--backend ray``: a sweep's points as Ray tasks on a local Ray give the serial rows."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from servelab import api  # noqa: E402
from servelab.core.errors import UserError  # noqa: E402
from servelab.core.request import SLO  # noqa: E402
from servelab.simulator.fanout import Fanout  # noqa: E402
from simkit import random_workload  # noqa: E402


@pytest.mark.slow
def test_sweep_on_local_ray_same_rows_as_serial():
    workload = random_workload(80, seed=4, rate=4.0)
    slo = SLO(ttft_s=0.5, tpot_s=0.05)
    started = not ray.is_initialized()
    try:
        heard = []
        try:
            fanned = api.sweep(workload, ["vllm", "sarathi"], [2.0, 8.0], slo=slo,
                               fanout=Fanout(jobs=2, backend="ray"), on_point=heard.append)
        except UserError as err:  # an overloaded machine: Ray's raylet missed its start-up deadline
            if "could not start a local Ray" in str(err):
                pytest.skip(str(err))
            raise
        serial = api.sweep(workload, ["vllm", "sarathi"], [2.0, 8.0], slo=slo)
    finally:
        if started and ray.is_initialized():
            ray.shutdown()
    drop = lambda rows: [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]  # noqa: E731
    assert drop(fanned) == drop(serial) and len(heard) == 4

