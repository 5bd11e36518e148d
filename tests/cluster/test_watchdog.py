"""The progress watchdog (issue 22, item 1): a run that stops making progress ends, and every
request still live is aborted with a reason that says the run was stuck."""

from __future__ import annotations

import pytest
from simkit import ToyCostModel

from servelab.cluster.config import ClusterConfig, InstanceGroup
from servelab.cluster.watchdog import WatchdogConfig, parse_watchdog
from servelab.core.errors import UserError
from servelab.core.plan import EMPTY_PLAN
from servelab.core.policy import POLICIES, ROUTERS, Move, Placement, Router, SchedulingPolicy
from servelab.core.request import RequestSpec, RequestStatus
from servelab.simulator import Simulation


@POLICIES.register("test-watchdog-never-runs", hidden=True)
class NeverRuns(SchedulingPolicy):
    """Holds whatever is queued and never plans a step."""

    def schedule(self, now_s, state):
        return EMPTY_PLAN


@ROUTERS.register("test-watchdog-polls-forever", hidden=True)
class PollsForever(Router):
    """Places on instance 0, then polls every 10 ms for ever (the InferCept pattern)."""

    def on_arrival(self, now_s, request, cluster):
        return [Placement(request, 0)]

    def next_wakeup_s(self, now_s):
        return now_s + 0.01


@ROUTERS.register("test-watchdog-ping-pong", hidden=True)
class PingPong(Router):
    """Moves each request to the other instance 10 ms after it lands: churn, no progress."""

    def __init__(self) -> None:
        self.landed = []

    def on_arrival(self, now_s, request, cluster):
        return [Placement(request, 0), Move(request, 1)]

    def on_moved(self, now_s, request, destination, cluster):
        self.landed.append((request, destination))
        return []

    def next_wakeup_s(self, now_s):
        return now_s + 0.01 if self.landed else None

    def on_timer(self, now_s, cluster):
        landed, self.landed = self.landed, []
        return [Move(request, 1 - destination) for request, destination in landed]


def _run(router: str, watchdog: WatchdogConfig, num_instances: int = 1):
    cluster = ClusterConfig(groups=(InstanceGroup(count=num_instances, policy="test-watchdog-never-runs"),),
                            router=router)
    specs = [RequestSpec(i, 0.1 * i, 64, 8) for i in range(3)]
    return Simulation(specs, cluster, cost_model=ToyCostModel(), watchdog=watchdog).run()


def _assert_stuck(res) -> None:
    assert res.conserved
    assert {r.status for r in res.requests} == {RequestStatus.ABORTED}
    assert all(r.finish_reason.startswith("stuck: no request arrived, ended or got closer to its end")
               for r in res.requests), res.requests[0].finish_reason


def test_a_timer_that_polls_for_ever_is_stopped_after_the_event_limit():
    res = _run("test-watchdog-polls-forever", WatchdogConfig(max_events=2_000, max_idle_s=0))
    _assert_stuck(res)
    assert "2,048 events" in res.requests[0].finish_reason  # checked every 256 events
    assert res.requests[0].finish_time_s == pytest.approx(0.2 + 2_048 * 0.01, abs=3 * 0.01 * 256)


def test_the_time_limit_stops_a_run_that_idles_on_the_clock():
    res = _run("test-watchdog-polls-forever", WatchdogConfig(max_events=0, max_idle_s=5.0))
    _assert_stuck(res)
    # progress is seen at a check (every 256 events here 2.56 s apart), so the limit may be passed by one interval
    assert 5.2 < res.requests[0].finish_time_s < 5.2 + 2 * 2.56


def test_moves_that_undo_each_other_are_not_progress():
    res = _run("test-watchdog-ping-pong", WatchdogConfig(max_events=1_000, max_idle_s=0), num_instances=2)
    _assert_stuck(res)
    assert len(res.transfers) > 500  # it churned, and churn alone never counted as progress


def test_a_working_run_is_left_alone(toy_cost):
    """A long decode, timers ticking beside it: progress at every check, no abort."""
    cluster = ClusterConfig(groups=(InstanceGroup(policy="vllm"),), router="test-watchdog-polls-forever")
    specs = [RequestSpec(0, 0.0, 100, 3_000)]
    res = Simulation(specs, cluster, cost_model=toy_cost, watchdog=WatchdogConfig(max_events=300)).run()
    assert res.requests[0].status is RequestStatus.FINISHED


@pytest.mark.parametrize("text,expected", [("on", WatchdogConfig()), ("off", WatchdogConfig(enabled=False)),
                                           ("events=10", WatchdogConfig(max_events=10)),
                                           ("events=0,idle_s=60", WatchdogConfig(0, 60.0))])
def test_parse_watchdog(text, expected):
    assert parse_watchdog(text) == expected


@pytest.mark.parametrize("text", ["", " ", "events", "events=-1", "idle_s=nan", "idle_s=inf", "events=1.5", "x=1",
                                  "events=1,events=2"])
def test_bad_watchdog_settings_are_one_line_errors_naming_the_flag(text):
    with pytest.raises(UserError, match="--watchdog") as err:
        parse_watchdog(text)
    assert "\n" not in str(err.value)
