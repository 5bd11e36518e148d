"""BucketServe (Zheng et al. 2025): length buckets, bucket prefills, memory-safe batches.

Requests needing a prefill are bucketed by sequence length, one ``BucketManager`` per task
class (online, offline). At each decision the controller estimates N_max (Eq. 6 with the
monitor's average length on the live free KV blocks, capped by the rows one batch can run
under the step limit), runs ADJUSTBUCKETS, picks a bucket (online: the one holding the
longest-waiting request, FCFS inside; offline: the fullest, SJF or LJF inside) and takes the
largest prefix of it whose KV fits the free blocks and whose size fits the step limit.

How a bucket batch runs (``padded``): BucketServe is built on vLLM (Sec. V-A), whose prefill
has run prompts as one flattened, unpadded (ragged) batch since v0.4 (vllm-project/vllm#3236
replaced the ``[batch, max_len]`` padded layout), so by default the batch is charged ragged,
exactly as DistServe's vLLM prefill is. ``padded=True`` runs it as one dense padded batch
(``PaddedBatch``): vLLM <= 0.3, or engines with 2D prefill shapes.

Eq. 5 (keep 10% of the memory after the model for system overheads) is the instance's own
memory reserve, vLLM's ``gpu_memory_utilization=0.9``, which every system gets; the policy
does not take another 10% off (``safe_fraction=1.0``; 0.9 applies Eq. 5 a second time to
the live free blocks, the behaviour before this was fixed).

Everything else is continuous batching: requests whose KV arrived from a prefill instance
(P/D hand-off, routed by the ``distserve`` router as BucketServe's P/D scheduler does: FCFS
to prefill workers, KV over NVLink, continuous batching on decode) join the decode batch,
and in a coupled (mixed) instance the policy decodes its own prefills. A step is either a
bucket prefill or a decode of every running request (prefill first, as vLLM v0), so on a
prefill-role instance, where each request leaves right after its prefill, only bucket
batches run. Decode growth that outruns memory preempts the newest request (recompute),
which goes back into its bucket: no plan ever needs memory the instance does not have.

The policy never reads a clock; bucketing overhead is measured by the benchmark in
``servelab.designs.bucketserve.overhead``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from servelab.cluster.config import ClusterConfig
from servelab.cluster.presets import pd_cluster, register_preset
from servelab.costmodel.links import LinkSpec

from servelab.designs.bucketserve.buckets import BucketingConfig, BucketManager
from servelab.designs.bucketserve.controller import BatchLimits, estimate_n_max, form_batch, safe_blocks
from servelab.designs.bucketserve.monitor import GlobalMonitor
from servelab.core.plan import EMPTY_PLAN, PaddedBatch, StepPlan, StepResult, StepShape
from servelab.core.policy import POLICIES, InstanceState, SchedulingPolicy
from servelab.core.request import Request, ServiceClass
from servelab.core.planning import PlanBuilder, admission_error, fcfs_key, run_held_kv


@dataclass(frozen=True)
class BucketServeConfig:
    """max_len: L_max (model context). theta, min_split_size (None = N_max), min_width,
    split_high: see ``BucketingConfig``. safe_fraction: share of the free KV blocks a batch may
    take on top of the instance's reserve (1.0: Eq. 5 counted once, as that reserve).
    offline_order: sjf | ljf inside an offline bucket. offline_bucket: fullest | oldest.
    online_first: online buckets are served before offline ones. padded: run bucket prefills
    as dense padded batches (False: ragged, as vLLM >= 0.4 runs them). cap_n_max: cap N_max
    by the rows one batch can run under the step limit. max_waste: stop growing a padded batch
    before its waste ratio (Eq. 2) exceeds this; 1.0 (the paper's behaviour) never stops.
    repeat: ADJUSTBUCKETS repeats its split pass until no bucket qualifies (a variant; the
    paper's Algorithm 1 makes one pass per adjustment).
    """

    max_len: int = 4096
    theta: float = 0.5
    min_split_size: int | None = None
    min_width: int = 16
    split_high: bool = False
    safe_fraction: float = 1.0
    offline_order: str = "ljf"
    offline_bucket: str = "fullest"
    online_first: bool = True
    padded: bool = False
    cap_n_max: bool = True
    max_waste: float = 1.0  # extension (not in the paper): cap a padded batch's Eq. 2 waste ratio
    repeat: bool = False  # ADJUSTBUCKETS repeats its split pass until stable (False: one pass, Algorithm 1)

    def __post_init__(self) -> None:
        if not 0 < self.safe_fraction <= 1:
            raise ValueError(f"safe_fraction must be in (0, 1], got {self.safe_fraction}")
        if self.offline_order not in ("sjf", "ljf"):
            raise ValueError(f"offline_order must be sjf or ljf, got {self.offline_order!r}")
        if not 0 <= self.max_waste <= 1:
            raise ValueError(f"max_waste must be in [0, 1], got {self.max_waste}")
        if self.offline_bucket not in ("fullest", "oldest"):
            raise ValueError(f"offline_bucket must be fullest or oldest, got {self.offline_bucket!r}")
        self.bucketing()  # validates max_len, theta, min_split_size, min_width

    def bucketing(self) -> BucketingConfig:
        return BucketingConfig(self.max_len, self.theta, self.min_split_size, self.min_width, self.split_high,
                               self.repeat)


@POLICIES.register("bucketserve")
class BucketServePolicy(SchedulingPolicy):
    Config = BucketServeConfig
    stable_under_decode = True

    def __init__(self, config: BucketServeConfig = BucketServeConfig()) -> None:
        self.config = config
        self.buckets: dict[ServiceClass, BucketManager] = {c: BucketManager(config.bucketing()) for c in ServiceClass}
        self.monitor = GlobalMonitor()
        self._incoming: list[Request] = []
        self._issued_s: float | None = None
        self._prefill: tuple[tuple[int, ...], int] | None = None  # last bucket batch: ids, rows x longest

    # ---- hooks ----
    def on_arrival(self, now_s: float, request: Request) -> None:
        self._incoming.append(request)
        if request.num_computed_tokens == 0:
            self.monitor.on_arrival(now_s, request.num_tokens)

    def on_finish(self, now_s: float, request: Request) -> None:
        manager = self.buckets[request.spec.service_class]
        if request.request_id in manager:
            manager.remove(request.request_id)

    def on_step_done(self, now_s: float, plan: StepPlan, result: StepResult, shape: StepShape) -> None:
        # the simulator reports duration 0; the latency is the time since the plan went out
        duration = result.duration_s or (now_s - self._issued_s if self._issued_s is not None else 0.0)
        # a bucket prefill: Eq. 2's waste is counted on its rectangle whether or not it is computed
        prefill = self._prefill is not None and plan.request_ids == self._prefill[0]
        rect = self._prefill[1] if prefill else 0
        self.monitor.on_step(duration, is_prefill=prefill, padded_tokens=rect,
                             real_tokens=plan.total_tokens if prefill else 0)

    # ---- scheduling ----
    def schedule(self, now_s: float, state: InstanceState) -> StepPlan:
        rejects = self._intake(state)
        plan = self._bucket_prefill(now_s, state, rejects)
        if plan is None:
            plan = self._decode_step(state, rejects)
        if not plan.is_empty:
            self._issued_s = now_s
        return plan

    def _intake(self, state: InstanceState) -> list[tuple[int, str]]:
        """Bucket newly arrived prefills; refuse requests that could never run here."""
        rejects = []
        for req in self._incoming:
            if req.status.is_terminal:
                continue
            reason = self._never_fits(req, state)
            if reason is not None:
                rejects.append((req.request_id, reason))
            elif req.num_computed_tokens == 0:
                self._bucket(req)
        self._incoming.clear()
        return rejects

    def _never_fits(self, req: Request, state: InstanceState) -> str | None:
        if req.num_computed_tokens == 0:
            if req.num_tokens > self.config.max_len:
                return f"sequence of {req.num_tokens} tokens exceeds max_len {self.config.max_len}"
            if req.num_tokens > state.max_batch_tokens:
                return f"prompt of {req.num_tokens} tokens exceeds the step limit {state.max_batch_tokens}"
            usable = safe_blocks(state.blocks.num_gpu_blocks, self.config.safe_fraction)
            if state.blocks.blocks_for(req.num_tokens) > usable:
                return f"prompt needs {state.blocks.blocks_for(req.num_tokens)} KV blocks; {usable} are ever safe"
        if state.role != "prefill":
            return admission_error(req, state)  # it must also hold its whole output here
        return None

    def _bucket(self, req: Request) -> None:
        length = min(req.num_tokens, self.config.max_len)  # a recompute may have grown past L_max
        self.buckets[req.spec.service_class].add(req.request_id, length, req.arrival_time_s)

    def _bucket_prefill(self, now_s: float, state: InstanceState, rejects: list) -> StepPlan | None:
        """One padded prefill of a bucket batch, or None when no bucket batch fits now."""
        blocks = state.blocks
        free = blocks.num_free_gpu_blocks
        n_max = estimate_n_max(self.monitor.avg_seq_len, free, blocks.block_size, self.config.safe_fraction,
                               state.max_num_seqs, self._step_rows(state))
        splits, merged = 0, False
        for manager in self.buckets.values():
            result = manager.adjust(n_max)
            splits += result.num_splits
            merged |= result.merged
        self.monitor.on_decision(now_s, num_queued=sum(len(m) for m in self.buckets.values()),
                                 num_running=state.num_running,
                                 memory_used_frac=blocks.num_used_gpu_blocks / blocks.num_gpu_blocks,
                                 num_buckets=sum(m.num_buckets for m in self.buckets.values()),
                                 num_splits=splits, merged=merged)
        picked = self._pick(state, free)
        if not picked:
            return None
        manager, reqs = picked
        manager.remove_many([req.request_id for req in reqs])
        longest = max(r.num_pending_tokens for r in reqs)
        padding = PaddedBatch(len(reqs), longest, longest) if self.config.padded else None
        ids = tuple(r.request_id for r in reqs)
        self._prefill = (ids, len(reqs) * longest)
        return StepPlan(ids, tuple(r.num_pending_tokens for r in reqs), reject=tuple(rejects), padding=padding)

    def _step_rows(self, state: InstanceState) -> int | None:
        """Rows one batch can run under the step limit (None: no cap): padded, each row costs the
        longest queued sequence (the merged bucket's rows); ragged, the average length."""
        if not self.config.cap_n_max:
            return None
        if self.config.padded:
            row = max((m.longest() for m in self.buckets.values() if len(m)), default=0)
        else:
            row = math.ceil(self.monitor.avg_seq_len)
        return state.max_batch_tokens // row if row > 0 else None

    def _pick(self, state: InstanceState, free_blocks: int) -> tuple[BucketManager, list[Request]] | None:
        limits = BatchLimits(safe_blocks(free_blocks, self.config.safe_fraction), state.blocks.block_size,
                             state.max_num_seqs, state.max_batch_tokens)
        classes = [ServiceClass.ONLINE, ServiceClass.OFFLINE]
        if not self.config.online_first:
            classes.reverse()
        by_id = {r.request_id: r for r in state.waiting}
        for cls in classes:
            manager = self.buckets[cls]
            if not len(manager):
                continue
            if cls is ServiceClass.ONLINE or self.config.offline_bucket == "oldest":
                index = manager.oldest_bucket()
            else:
                index = manager.fullest_bucket()
            order = "fcfs" if cls is ServiceClass.ONLINE else self.config.offline_order
            entries = manager.candidates(index, order, state.max_num_seqs)
            reqs = [by_id[e.key] for e in entries if e.key in by_id]
            n = form_batch([r.num_tokens for r in reqs], limits, padded=self.config.padded,
                           max_waste=self.config.max_waste)
            if n:
                return manager, reqs[:n]
            return None  # the head waits for memory; lower classes do not overtake it
        return None

    def _decode_step(self, state: InstanceState, rejects: list) -> StepPlan:
        """Continuous batching: every running decode plus KV-ready arrivals, FCFS."""
        b = PlanBuilder(state, token_budget=state.max_batch_tokens)
        b.reject = rejects
        b.add_decodes(sorted(state.running, key=fcfs_key))
        rejected = {rid for rid, _ in rejects}
        if not b.preempt:
            ready = [r for r in state.waiting
                     if r.num_computed_tokens > 0 and r.num_pending_tokens == 1 and r.request_id not in rejected]
            for req in ready:
                if not b.try_add(req, 1, new_request=True):
                    break
            if not b.ids and ready and not state.num_running:
                # nothing runs and the hand-offs waiting with their KV hold the blocks (a burst's
                # transfers filled the cache): run them, or give the last one's KV up, as vllm does
                # (found by the offline reproduction: 839 of 1,000 requests stranded)
                run_held_kv(state, ready, b)
        by_id = {r.request_id: r for r in state.running}
        by_id.update((r.request_id, r) for r in state.waiting)
        for rid in b.preempt:
            self._bucket(by_id[rid])  # recompute later: back into its bucket
        plan = b.build()
        return plan if not plan.is_empty else EMPTY_PLAN

    def report(self) -> dict:
        """Monitor figures plus the current bucket edges, for results."""
        out = self.monitor.summary()
        out["bucket_edges"] = {c.value: m.edges() for c, m in self.buckets.items()}
        return out


@register_preset("bucketserve-pd")
def _bucketserve_pd(num_instances: int, params: dict[str, Any], group: dict[str, Any], link: LinkSpec) -> ClusterConfig:
    """BucketServe's deployment: bucket batches on prefill instances, KV over the link,
    continuous batching on decode instances."""
    return pd_cluster("bucketserve-pd", "bucketserve", num_instances, params, group, link)
