"""Conservation under adversarial workloads: the systems, the cases and the checks.

A *system* is a policy (or preset) at 1 or 2 instances, or a router over vLLM instances;
together they cover every registered policy and router and the presets. An *adversarial
case* is a hypothesis strategy for a small workload plus the hardware it runs on: all
arrivals at time 0, prompts beyond the KV cache, prompts beyond the context, 1-token
outputs, a tiny KV cache with heavy preemption, a very high arrival rate. Every run must:

* conserve requests: arrived = completed + rejected + aborted, every request ended;
* give every rejection and abort a non-empty reason;
* never finish a request over the context (prompt as run + output <= max_model_len, and
  under ``reject`` no request whose original prompt + output was over it);
* be deterministic: the same workload and config give byte-identical per-request outcomes
  and token times (``canonical_dump``).

``tests/reliability/test_conservation.py`` runs every (system, case) cell with fresh
random workloads; ``scripts/reliability_report.py`` runs the same cells with a fixed seed
and writes the matrix to docs/reliability.md. Runs use ``ToyCostModel`` (exact, fast):
what is checked is bookkeeping, not timing.
"""

from __future__ import annotations

import collections
import json
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from reliability.cases import TIME_LIMIT_S, Hang, time_limit
from simkit import ToyCostModel

from servelab.catalog.models import get_model
from servelab.cluster.config import ClusterConfig, InstanceGroup
from servelab.cluster.presets import PRESETS, cluster_for
from servelab.core.request import RequestSpec, RequestStatus
from servelab.metrics import RequestTable, summarize
from servelab.simulator import simulate

MAX_REQUESTS = 16
NORMAL = {"gpu": "A100-80GB", "model": "Llama-2-7B"}  # 7,609 KV blocks, context 4,096
# 19 KV blocks of 16 tokens (304 tokens): the 13B weights leave almost nothing after this reserve.
TINY_KV = {"gpu": "A100-40GB", "model": "Llama-2-13B", "memory_reserve_fraction": 0.388}
TINY_KV_TOKENS = 19 * 16


@dataclass(frozen=True)
class System:
    """A cluster shape: ``spec`` through ``cluster_for`` (policies and presets), or vLLM
    instances behind ``router``."""

    label: str
    spec: str
    num_instances: int
    router: str | None = None

    def cluster(self, hardware: dict[str, Any], on_overflow: str = "reject") -> ClusterConfig:
        if self.router is None:
            cluster = cluster_for(self.spec, num_instances=self.num_instances, **hardware)
        else:
            cluster = ClusterConfig(groups=(InstanceGroup(count=self.num_instances, policy=self.spec, **hardware),),
                                    router=self.router)
        return replace(cluster, on_overflow=on_overflow)


def shipped(registry) -> list[str]:
    """The registry's listed names that servelab itself defines (tests register their own)."""
    return [n for n in registry.names() if registry.get(n).__module__.startswith("servelab.")]


def systems() -> list[System]:
    """Every listed policy (presets included) at 1 and 2 instances, every router, every preset
    at 2 instances (the P/D presets need 2)."""
    from servelab.core.policy import POLICIES, ROUTERS

    out = [System(f"{name} x{n}", name, n) for name in shipped(POLICIES) for n in (1, 2)]
    for name in shipped(ROUTERS):
        if name in PRESETS:  # a router that shapes its cluster runs in its preset
            continue
        out += [System(f"vllm/{name} x{n}", "vllm", n, router=name) for n in (1, 2)]
    out += [System(f"{name} x2", name, 2) for name in sorted(PRESETS) if name not in shipped(POLICIES)]
    labels = [s.label for s in out]
    assert len(labels) == len(set(labels)), labels
    return out


@dataclass(frozen=True)
class Draw:
    """One generated case: the workload, and how over-long requests are handled."""

    specs: tuple[RequestSpec, ...]
    on_overflow: str = "reject"


@dataclass(frozen=True)
class AdversarialCase:
    name: str
    description: str
    strategy: st.SearchStrategy  # of Draw
    hardware: dict[str, Any] = field(default_factory=lambda: dict(NORMAL))


def _workload(prompts: st.SearchStrategy, outputs: st.SearchStrategy, gaps: st.SearchStrategy, *,
              min_size: int = 1, first: st.SearchStrategy | None = None) -> st.SearchStrategy:
    """Specs from drawn (prompt, output, gap) rows, arrival = running sum of the gaps.
    ``first`` (a row strategy) puts the case's edge into every draw, so even hypothesis's
    simplest example reaches it."""
    rows = st.lists(st.tuples(prompts, outputs, gaps), min_size=min_size, max_size=MAX_REQUESTS)
    if first is not None:
        rows = st.tuples(first, rows).map(lambda head_rest: [head_rest[0], *head_rest[1]][:MAX_REQUESTS])

    def build(items):
        specs, now = [], 0.0
        for i, (prompt, output, gap) in enumerate(items):
            now += gap
            specs.append(RequestSpec(i, now, prompt, output, predicted_output_tokens=output, priority=i % 3))
        return tuple(specs)

    return rows.map(build)


_AT_ZERO = st.just(0.0)
_CONTEXT = get_model(NORMAL["model"]).max_context
_OVER_KV = st.tuples(st.integers(TINY_KV_TOKENS + 1, 4 * TINY_KV_TOKENS), st.integers(1, 64), _AT_ZERO)
_OVER_CONTEXT = st.tuples(st.integers(_CONTEXT, 2 * _CONTEXT), st.integers(1, 2000), _AT_ZERO)


def adversarial_cases() -> list[AdversarialCase]:
    """The issue's six adversarial workloads; each draw has 1 to ``MAX_REQUESTS`` requests."""
    return [
        AdversarialCase("all_at_zero", "every request arrives at time 0",
                        st.builds(Draw, _workload(st.integers(1, 800), st.integers(1, 300), _AT_ZERO, min_size=2))),
        AdversarialCase("beyond_kv", f"prompts up to 4x a {TINY_KV_TOKENS}-token KV cache (the first always over)",
                        st.builds(Draw, _workload(st.integers(1, 4 * TINY_KV_TOKENS), st.integers(1, 64),
                                                  st.floats(0, 0.05), first=_OVER_KV)), dict(TINY_KV)),
        AdversarialCase("beyond_context", f"prompt + output up to 2x the {_CONTEXT:,}-token context (the first "
                        "always over); reject or truncate",
                        st.builds(Draw, _workload(st.integers(1, 2 * _CONTEXT), st.integers(1, 2000),
                                                  st.floats(0, 0.05), first=_OVER_CONTEXT),
                                  st.sampled_from(["reject", "truncate"]))),
        AdversarialCase("one_token_outputs", "every output is 1 token",
                        st.builds(Draw, _workload(st.integers(1, 1000), st.just(1), st.floats(0, 0.01)))),
        AdversarialCase("tiny_kv_preemption", f"3 or more requests that each fit a {TINY_KV_TOKENS}-token KV cache "
                        "but not together",
                        st.builds(Draw, _workload(st.integers(40, 100), st.integers(150, 180), st.floats(0, 0.002),
                                                  min_size=3)), dict(TINY_KV)),
        AdversarialCase("very_high_rate", "arrival gaps of 0 to 10 microseconds",
                        st.builds(Draw, _workload(st.integers(1, 600), st.integers(1, 200), st.floats(0, 1e-5)))),
    ]


@dataclass(frozen=True)
class Outcome:
    num_arrived: int
    num_completed: int
    num_rejected: int
    num_aborted: int
    problems: tuple[str, ...]  # empty when every check holds
    dump: bytes
    abort_reasons: tuple[str, ...] = ()


def run_cell(system: System, case: AdversarialCase, draw: Draw) -> Outcome:
    """Simulate ``draw`` on ``system`` with ``case``'s hardware and check the run."""
    cluster = system.cluster(case.hardware, draw.on_overflow)
    result = simulate(list(draw.specs), cluster, cost_model=ToyCostModel())
    limit = min(get_model(g.model).max_context for g in cluster.groups)
    problems = check_run(list(draw.specs), result, limit, draw.on_overflow)
    counts = collections.Counter(r.status for r in result.requests)
    return Outcome(len(result.requests), counts[RequestStatus.FINISHED], counts[RequestStatus.REJECTED],
                   counts[RequestStatus.ABORTED], tuple(problems), canonical_dump(result.requests),
                   tuple(r.finish_reason for r in result.requests if r.status is RequestStatus.ABORTED))


def check_run(specs: list[RequestSpec], result, limit: int, on_overflow: str) -> list[str]:
    problems = []
    if len(result.requests) != len(specs):
        problems.append(f"{len(specs)} submitted but {len(result.requests)} arrived")
    ended = collections.Counter(r.status for r in result.requests)
    num_terminal = sum(n for status, n in ended.items() if status.is_terminal)
    if num_terminal != len(result.requests) or not result.conserved:
        problems.append(f"not conserved: {dict(ended)}, unfinished {result.unfinished[:5]}")
    try:
        summarize(RequestTable.from_requests(result.requests), result.collector)
    except Exception as err:  # noqa: BLE001 - the summary's own conservation check
        problems.append(f"summary: {type(err).__name__}: {err}")
    original = {s.request_id: s for s in specs}
    for req in result.requests:
        if req.status in (RequestStatus.REJECTED, RequestStatus.ABORTED) and not (req.finish_reason or "").strip():
            problems.append(f"request {req.request_id} {req.status.value} without a reason")
        if req.status is RequestStatus.ABORTED and (req.finish_reason or "").startswith(("the run ended", "stuck:")):
            # no case injects a fault: a request still there when the events ran out was stranded
            # (a scheduling deadlock), and one the progress watchdog stopped was in a livelock,
            # however politely either was then aborted
            problems.append(f"request {req.request_id} stranded: {req.finish_reason}")
        if req.status is RequestStatus.FINISHED:
            spec = original[req.request_id]
            if req.num_prompt_tokens + req.num_generated_tokens > limit:
                problems.append(f"request {req.request_id} finished with {req.num_prompt_tokens} + "
                                f"{req.num_generated_tokens} tokens over the {limit} context")
            if on_overflow == "reject" and spec.num_prompt_tokens + spec.num_output_tokens > limit:
                problems.append(f"request {req.request_id} ({spec.num_prompt_tokens} + {spec.num_output_tokens}) "
                                f"is over the {limit} context but finished")
    return problems


def canonical_dump(requests) -> bytes:
    """Per-request outcomes and token times (exact, as float hex), sorted by id, as bytes."""
    rows = [[r.request_id, r.status.value, r.finish_reason, r.num_prompt_tokens, r.num_generated_tokens,
             r.instance_id, [t.hex() for t in r.token_times_s],
             None if r.finish_time_s is None else float(r.finish_time_s).hex()]
            for r in sorted(requests, key=lambda r: r.request_id)]
    return json.dumps(rows, separators=(",", ":")).encode()


def run_twice(system: System, case: AdversarialCase, draw: Draw) -> Outcome:
    """``run_cell`` twice; a second run that differs is a determinism problem, and a run
    that does not end within ``TIME_LIMIT_S`` is a problem too (not a stuck suite)."""
    try:
        with time_limit(TIME_LIMIT_S):
            first = run_cell(system, case, draw)
            again = run_cell(system, case, draw)
    except Hang as hang:
        return Outcome(len(draw.specs), 0, 0, 0, (f"the run did not end: {hang}",), b"")
    if again.dump != first.dump:
        return replace(first, problems=first.problems + ("the same workload and config gave different results",))
    return first


@dataclass
class CellTally:
    """Outcomes of several generated workloads in one (system, case) cell."""

    num_runs: int = 0
    num_arrived: int = 0
    num_completed: int = 0
    num_rejected: int = 0
    num_aborted: int = 0
    problems: list[tuple[Draw, str]] = field(default_factory=list)
    abort_reasons: collections.Counter = field(default_factory=collections.Counter)

    def add(self, draw: Draw, outcome: Outcome) -> None:
        self.num_runs += 1
        self.num_arrived += outcome.num_arrived
        self.num_completed += outcome.num_completed
        self.num_rejected += outcome.num_rejected
        self.num_aborted += outcome.num_aborted
        self.problems += [(draw, p) for p in outcome.problems]
        self.abort_reasons.update(outcome.abort_reasons)


def tally_cell(system: System, case: AdversarialCase, num_examples: int, random_seed: int) -> CellTally:
    """``num_examples`` workloads from ``case.strategy`` with a fixed seed (generate phase
    only: every example counted once), each run twice."""
    cell = CellTally()

    @seed(random_seed)
    @settings(max_examples=num_examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case.strategy)
    def run(draw):
        cell.add(draw, run_twice(system, case, draw))

    run()
    return cell
