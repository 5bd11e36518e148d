"""One local Ray per test worker for every module here, started by the first test that needs it.

A Ray start costs about 6.6 CPU-s in its daemons (GCS, raylet, agents), which the per-test CPU
log does not see. With one Ray per module, xdist's one-test-at-a-time scheduling interleaves the
modules on a worker, so their module fixtures tore Ray down and started it again up to five
times a suite run; the modules' own fixtures (actors, loaded checkpoints) still come and go.
"""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")


@pytest.fixture(scope="session")
def ray_session():
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    if started and ray.is_initialized():
        ray.shutdown()
