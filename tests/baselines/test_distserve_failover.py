"""DistServe through the loss of a whole pool: the survivors serve whole requests.

With the only decode instance failed (its requests re-queued for recompute), every request
still ends finished: new and re-queued requests run whole on the prefill instance instead of
being rejected for a missing pool. A cluster configured without a decode pool is still a
configuration error, said in each request's rejection.
"""

from __future__ import annotations

from servelab.baselines.distserve import DistServeRouter
from servelab.cluster.config import ClusterConfig, InstanceGroup
from servelab.cluster.reconfig import FailInstance
from servelab.core.policy import ROUTERS
from servelab.core.request import RequestSpec, RequestStatus
from servelab.simulator import Simulation


@ROUTERS.register("test_distserve_fail_decode")
class FailDecodeRouter(DistServeRouter):
    """DistServe whose decode instance (id 1) fails after the first completed step past 1 s."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def on_step_done(self, now_s, instance_id, shape, finished, cluster):
        if not self.failed and now_s >= 1.0:
            self.failed = True
            return [FailInstance(1, requeue=True)]
        return []


def _cluster(router: str, roles=("prefill", "decode")) -> ClusterConfig:
    return ClusterConfig(groups=tuple(InstanceGroup(role=r, policy="vllm") for r in roles), router=router)


def test_losing_the_decode_pool_degrades_to_whole_requests_on_the_prefill_instance():
    specs = [RequestSpec(i, 0.05 * i, 200 + 3 * i, 80) for i in range(80)]
    sim = Simulation(specs, _cluster("test_distserve_fail_decode"))
    res = sim.run()
    assert sim.driver.router.failed
    assert [r.status for r in res.requests] == [RequestStatus.FINISHED] * 80
    assert all(r.num_generated_tokens == 80 for r in res.requests)
    late = [r for r in res.requests if r.arrival_time_s > 1.5]
    assert late and all(r.instance_id == 0 for r in late)  # ran whole on the surviving prefill instance


def test_a_cluster_without_a_decode_pool_is_still_a_configuration_error():
    specs = [RequestSpec(i, 0.0, 50, 10) for i in range(3)]
    res = Simulation(specs, _cluster("distserve", roles=("prefill",))).run()
    assert {r.status for r in res.requests} == {RequestStatus.REJECTED}
    assert all("needs prefill and decode" in r.finish_reason for r in res.requests)
