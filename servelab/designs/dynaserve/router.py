"""DynaServe's global scheduler: split each request into two micro-requests at arrival.

Instances are unified (each runs the ``dynaserve`` local scheduler) and take either part:
for each arrival the router picks as alpha the instance where a new prefill would start
first and as beta the least loaded of the others, by their predicted timelines
(``pairing=fixed``: the first half of the cluster takes alpha parts, the second half beta
parts, the deployment of the paper's Figure 5). It predicts the output length (the
request's prediction plus ``margin_tokens``), runs Algorithm 1 (``choose_split``) and
returns one ``Placement``: the request starts on alpha, hands off at ``s`` computed tokens
and continues on beta, its KV streaming there in ``stream_kv_tokens`` chunks while alpha
computes (0: one bulk copy at the hand-off). ``s = 0`` or ``s = N`` places it whole.
Both segments are then committed to the two timelines.

Streaming and memory: beta reserves a streamed request's KV when its first chunk starts
(the cluster layer's rule), so a split in the decode phase would hold beta's memory for
alpha's whole decode phase (at high load beta's KV fills and preempts). By default only
splits inside the prompt stream (their KV is large and on the TTFT path); a decode-phase
split copies at the hand-off, a few hundred tokens in well under a millisecond over NVLink
(``stream_decode_splits`` streams them too, the paper's setting; the reproduction measures
both).

Calibration: the timelines drift from what really ran (predicted lengths, the local
scheduler's own choices). Every ``resync_s`` of simulated time after one of its steps, an
instance's timeline is rebuilt from its real queue (running decodes, prefill still to do,
incoming transfers, and beta parts whose alpha has not handed off yet).

``split=fixed`` skips the search and splits every request at ``P + decode_fraction * D``
(a negative fraction cuts the prompt): the split-ratio sweep of the paper's Figure 5.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from servelab.cluster.config import ClusterConfig, InstanceGroup
from servelab.cluster.presets import register_preset
from servelab.core.policy import ROUTERS, ClusterState, InstanceState, Placement, Router
from servelab.core.registry import RegistryError
from servelab.core.request import Request
from servelab.costmodel.links import LinkSpec
from servelab.designs.dynaserve.policy import DynaServePolicyConfig
from servelab.designs.dynaserve.profile import ProfileTable
from servelab.designs.dynaserve.split import alpha_segment, beta_segment, choose_split, segments_for, work_after
from servelab.designs.dynaserve.timeline import Segment, Timeline

_SPLIT_MODES = ("dynamic", "fixed")


@dataclass(frozen=True)
class DynaServeRouterConfig:
    margin_tokens: int = 20  # added to the predicted output length (underestimates cost SLOs)
    max_probes: int = 6
    tolerance: float = 0.02  # stop when the two finish times are this close (share of the work ahead)
    stream_kv_tokens: int = 128  # KV chunk streamed while alpha computes; 0 = one bulk copy
    stream_decode_splits: bool = False  # stream also when the hand-off is after the first token
    min_segment_tokens: int = 16  # a micro-request shorter than this is not split off
    split: str = "dynamic"
    pairing: str = "load"  # load | fixed (see _pair)
    decode_fraction: float = 0.0  # split=fixed: s = P + decode_fraction * D
    resync_s: float = 1.0
    kv_limit: float = 0.9  # no part goes to a beta whose KV blocks were fuller than this after its last step
    tbt_slo_s: float = 0.1  # for timelines of instances whose policy is not dynaserve
    headroom: float = 0.1

    def __post_init__(self) -> None:
        if self.margin_tokens < 0 or self.stream_kv_tokens < 0 or self.min_segment_tokens < 0:
            raise ValueError("margin_tokens, stream_kv_tokens and min_segment_tokens must be >= 0")
        if not 1 <= self.max_probes <= 64:
            raise ValueError(f"max_probes must be in [1, 64], got {self.max_probes}")
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"tolerance must be in [0, 1), got {self.tolerance}")
        if self.pairing not in ("load", "fixed"):
            raise ValueError(f"pairing must be load or fixed, got {self.pairing!r}")
        if self.split not in _SPLIT_MODES:
            raise ValueError(f"split must be one of {_SPLIT_MODES}, got {self.split!r}")
        if not -1 <= self.decode_fraction <= 1:
            raise ValueError(f"decode_fraction must be in [-1, 1], got {self.decode_fraction}")
        if not 0 < self.kv_limit <= 1:
            raise ValueError(f"kv_limit must be in (0, 1], got {self.kv_limit}")
        if not self.resync_s > 0 or not self.tbt_slo_s > 0 or not 0 <= self.headroom < 1:
            raise ValueError("resync_s and tbt_slo_s must be > 0 and headroom in [0, 1)")


@dataclass(slots=True)
class _Split:
    request: Request
    total: int  # P + predicted D + margin
    split: int
    alpha: int
    beta: int
    alpha_end_s: float  # predicted end of the alpha part


@ROUTERS.register("dynaserve")
class DynaServeRouter(Router):
    Config = DynaServeRouterConfig

    def __init__(self, config: DynaServeRouterConfig = DynaServeRouterConfig()) -> None:
        self.config = config
        self.timelines: dict[int, Timeline] = {}
        self._splits: dict[int, _Split] = {}  # requests with a part still ahead, by id
        self._last_sync: dict[int, float] = {}
        self._transfer: dict[tuple[int, int], tuple[float, float]] = {}  # (alpha, beta) -> latency, s/token
        self.decisions: list[tuple[int, int, int, int]] = []  # (request id, P, N, s) per arrival
        self.landed_s: dict[int, float] = {}  # request id -> when its KV landed on beta
        self._kv: dict[int, float] = {}  # instance id -> KV blocks in use after its last step
        self.num_streamed = 0  # split requests whose KV streams in chunks while alpha computes
        self.num_bulk = 0  # split requests whose KV is copied at the hand-off

    # ---- arrivals ----
    def on_arrival(self, now_s: float, request: Request, cluster: ClusterState) -> list[Placement]:
        insts = cluster.instances
        prompt = request.num_prompt_tokens
        total = prompt + request.spec.expected_output_tokens + self.config.margin_tokens
        if len(insts) == 1:
            self.decisions.append((request.request_id, prompt, total, total))
            return [Placement(request, insts[0].instance_id)]
        alpha, beta = self._pair(insts, now_s)
        ta, tb = self.timelines[alpha.instance_id], self.timelines[beta.instance_id]
        link = self._link(alpha, beta, cluster)
        ready = ta.table.ready and tb.table.ready
        if self.config.split == "fixed":
            split = prompt + int(round(self.config.decode_fraction * request.spec.expected_output_tokens))
            split = min(max(split, 1), total)
        elif self._kv.get(beta.instance_id, 0.0) > self.config.kv_limit >= self._kv.get(alpha.instance_id, 0.0):
            split = total  # beta's HBM is nearly full: keep the request whole where there is room
        elif not ready:
            split = prompt  # nothing measured yet (engine start): plain disaggregation
        else:
            choice = choose_split(prompt, total, ta, tb, max_probes=self.config.max_probes,
                                  tolerance=self.config.tolerance)
            split = self._keep_handoff_gap(self._snap(choice.split_tokens, total), prompt, total, ta, tb)
        split = self._snap(split, total)
        self.decisions.append((request.request_id, prompt, total, split))
        if not ready:
            return [self._placement(request, split, total, alpha.instance_id, beta.instance_id)]
        return [self._place(request, prompt, total, split, alpha.instance_id, beta.instance_id, ta, tb, now_s, link)]

    def _keep_handoff_gap(self, split: int, prompt: int, total: int, ta: Timeline, tb: Timeline) -> int:
        """A hand-off after the first token puts one gap across two instances: the KV's last
        chunk, beta's step in flight and its next step, up to twice beta's step time. A
        request with fewer than 100 gaps may not exceed the TBT SLO even once (its P99 is its
        worst gap), so such a request (predicted under 100 tokens plus the margin, for it may
        be underestimated) is never handed off after its first token: the split moves to the
        prompt's last token (beta emits every token) or the whole request goes to alpha,
        whichever leaves the two instances closer in work."""
        if not prompt <= split < total or total - prompt > 100 + 2 * self.config.margin_tokens:
            return split
        best, best_gap = total, float("inf")
        for s in (prompt - 1, total):
            if s < self.config.min_segment_tokens:
                continue
            a, b = work_after(s, prompt, total, ta, tb)
            if abs(a - b) < best_gap:
                best, best_gap = s, abs(a - b)
        return best

    def _snap(self, split: int, total: int) -> int:
        m = self.config.min_segment_tokens
        if split < m:
            return 0
        return total if total - split < m else split

    def _place(self, request: Request, prompt: int, total: int, split: int, alpha: int, beta: int, ta: Timeline,
               tb: Timeline, now_s: float, link: tuple[float, float]) -> Placement:
        """Commit both parts to the (ready) timelines ``ta`` / ``tb`` and place the request."""
        alpha_end = ta.add(alpha_segment(split, prompt, now_s)) if split > 0 else now_s
        if split < total:
            tb.queue(beta_segment(split, prompt, total, now_s, alpha_end + self._transfer_s(link, split, prompt)))
        if 0 < split < total:
            self._splits[request.request_id] = _Split(request, total, split, alpha, beta, alpha_end)
        return self._placement(request, split, total, alpha, beta)

    def _placement(self, request: Request, split: int, total: int, alpha: int, beta: int) -> Placement:
        if split <= 0:
            return Placement(request, beta)
        if split >= total:
            return Placement(request, alpha)
        stream = self.config.stream_kv_tokens or None
        if split > request.num_prompt_tokens and not self.config.stream_decode_splits:
            stream = None
        if stream is None:
            self.num_bulk += 1
        else:
            self.num_streamed += 1
        return Placement(request, alpha, handoff_at_tokens=split, handoff_target=beta, stream_kv_tokens=stream)

    def _pair(self, insts: Sequence[InstanceState], now_s: float) -> tuple[InstanceState, InstanceState]:
        """``pairing=fixed``: alpha from the first half, beta from the second, each the least
        loaded. ``pairing=load``: alpha where a new prefill would start first (to the millisecond;
        then the less loaded), beta the least loaded of the others (any instance takes either
        part)."""
        if self.config.pairing == "fixed":
            if len(insts) == 2:  # the paper's deployment: one alpha and one beta instance, no choice
                for inst in insts:
                    self._timeline(inst).advance(now_s)
                return insts[0], insts[1]
            half = (len(insts) + 1) // 2
            return self._least_loaded(insts[:half], now_s), self._least_loaded(insts[half:], now_s)
        keys = []
        timelines = self.timelines
        for inst in insts:
            t = timelines.get(inst.instance_id)
            if t is None:
                t = self._timeline(inst)
            t.advance(now_s)
            work = t.work_s
            keys.append((round(t.prefill_wait_s, 3), work, inst))  # ties (no prefill waiting): less work
        best = keys[0]
        for k in keys:  # the first smallest (wait, work), as min() picks it
            if (k[0], k[1]) < (best[0], best[1]):
                best = k
        alpha = best[2]
        beta_key = None
        for k in keys:
            if k[2] is not alpha and (beta_key is None or k[1] < beta_key[1]):
                beta_key = k
        return alpha, beta_key[2]

    def _least_loaded(self, insts: Sequence[InstanceState], now_s: float) -> InstanceState:
        best, best_t = insts[0], float("inf")
        for inst in insts:
            t = self._timeline(inst)
            t.advance(now_s)
            if t.work_s < best_t:
                best, best_t = inst, t.work_s
        return best

    def _timeline(self, inst: InstanceState) -> Timeline:
        t = self.timelines.get(inst.instance_id)
        if t is None:
            policy = getattr(inst, "policy", None)
            cfg = getattr(policy, "config", None)
            if isinstance(cfg, DynaServePolicyConfig):
                table, target = policy.table_for(inst), cfg.target_s
            else:
                cost = getattr(inst, "cost_model", None)
                table = (ProfileTable.from_cost_model(cost, inst.max_batch_tokens, inst.max_num_seqs)
                         if cost is not None else ProfileTable.unprofiled(inst.max_batch_tokens, inst.max_num_seqs))
                target = self.config.tbt_slo_s * (1 - self.config.headroom)
            t = self.timelines[inst.instance_id] = Timeline(table, target_s=target, max_num_seqs=inst.max_num_seqs)
        return t

    def _link(self, alpha: InstanceState, beta: InstanceState, cluster: ClusterState) -> tuple[float, float]:
        """(latency, seconds per KV token) of the link from alpha to beta, looked up once per pair."""
        key = (alpha.instance_id, beta.instance_id)
        got = self._transfer.get(key)
        if got is None:
            spec: LinkSpec = cluster.link(*key).spec
            per_token = getattr(alpha, "kv_bytes_per_token", 0.0) / spec.bandwidth_bytes_per_s
            got = self._transfer[key] = (spec.latency_s, per_token)
        return got

    def _transfer_s(self, link: tuple[float, float], split: int, prompt: int) -> float:
        """Seconds for the KV still to cross after alpha's last token: one chunk when streamed,
        all ``s`` tokens when bulk (decode-phase splits unless ``stream_decode_splits``)."""
        latency, per_token = link
        chunk = self.config.stream_kv_tokens
        streamed = chunk and (self.config.stream_decode_splits or split <= prompt)
        return latency + per_token * (min(split, chunk) if streamed else split)

    def report(self) -> dict:
        """The split decisions of the run (``summary.json``'s ``policy_reports["router"]``;
        the driver adds the decision times): where requests were split (inside the prompt,
        at its end as in disaggregation, in the decode, or not at all), the mean split point
        of the split ones (tokens, and as a share of the predicted total), the decode share
        alpha kept, and how many hand-offs streamed their KV vs copied it in bulk."""
        return split_statistics(self.decisions, self.num_streamed, self.num_bulk)

    # ---- feedback ----
    def on_step_done(self, now_s: float, instance_id: int, shape, finished: Sequence[Request],
                     cluster: ClusterState) -> list:
        for req in finished:
            self._splits.pop(req.request_id, None)
        for t in self.timelines.values():
            if t.pending:
                t.flush()
        inst = _find(cluster, instance_id)
        if inst is not None:
            self._kv[instance_id] = _kv_use(inst)
        last = self._last_sync.get(instance_id)
        if last is None or now_s - last >= self.config.resync_s:
            self._last_sync[instance_id] = now_s
            t = self.timelines.get(instance_id)
            if t is not None and t.table.ready and inst is not None:
                self.resync(inst, now_s)
        return []

    def on_moved(self, now_s: float, request: Request, destination: int, cluster: ClusterState) -> list:
        self.landed_s[request.request_id] = now_s
        self._splits.pop(request.request_id, None)
        return []

    def resync(self, inst: InstanceState, now_s: float) -> None:
        """Rebuild ``inst``'s timeline from its real queue and the beta parts still to come."""
        iid = inst.instance_id
        left, ctx, segments = [], [], []
        for req in list(inst.running) + list(inst.waiting):
            self._segment_of(req, now_s, left, ctx, segments)
        for req in inst.reserved.values():
            self._segment_of(req, now_s, left, ctx, segments, incoming=True)
        for rid, sp in list(self._splits.items()):
            req = sp.request
            if req.status.is_terminal:
                del self._splits[rid]
            elif sp.beta == iid and req.instance_id == sp.alpha and req.num_computed_tokens < sp.split:
                _, seg = segments_for(sp.split, req.num_prompt_tokens, sp.total, now_s, self._alpha_end(sp, now_s))
                segments.append(seg)
        self.timelines[iid].rebuild(now_s, np.array(left, np.int64), np.array(ctx, np.float64), segments)

    def _alpha_end(self, sp: _Split, now_s: float) -> float:
        """When a split request still on alpha will reach its split point: as predicted at
        placement, or later when alpha has fallen behind (one of alpha's passes per token)."""
        req = sp.request
        left = sp.split - max(req.num_computed_tokens, req.num_prompt_tokens)
        alpha = self.timelines.get(sp.alpha)
        step = alpha.step_s_at(now_s) if alpha is not None else 0.0
        return max(now_s, sp.alpha_end_s, now_s + max(left, 0) * step)

    def _segment_of(self, req: Request, now_s: float, left: list, ctx: list, segments: list, *,
                    incoming: bool = False) -> None:
        sp = self._splits.get(req.request_id)
        prompt = req.num_prompt_tokens
        total = sp.total if sp is not None else prompt + req.spec.expected_output_tokens + self.config.margin_tokens
        end = total if incoming or req.handoff_at_tokens is None else req.handoff_at_tokens
        done = req.num_computed_tokens
        if done >= prompt:
            if end > done:
                left.append(end - done)
                ctx.append(done)
        elif end > done:
            segments.append(Segment(now_s, min(prompt, end) - done, max(0, end - prompt), prompt))


def split_statistics(decisions: Sequence[tuple[int, int, int, int]], streamed: int, bulk: int) -> dict:
    """``report()`` from the (request id, P, N, s) decisions and the transfer counts."""
    d = np.array(decisions, dtype=np.int64).reshape(-1, 4)
    prompt, total, split = d[:, 1], d[:, 2], d[:, 3]
    n = len(d)
    cut = (split > 0) & (split < total)

    def share(mask: np.ndarray) -> float | None:
        return float(mask.sum() / n) if n else None

    def mean(values: np.ndarray) -> float | None:
        return float(values.mean()) if len(values) else None

    decode = np.clip(split - prompt, 0, None)[cut] / np.maximum(total - prompt, 1)[cut]
    return {"num_requests": n,
            "split_share": {"inside_prompt": share((split > 0) & (split < prompt)),
                            "at_prompt_end": share(cut & (split == prompt)),
                            "in_decode": share((split > prompt) & (split < total)),
                            "none": share(~cut)},
            "whole_on_alpha": share(split >= total), "whole_on_beta": share(split <= 0),
            "mean_split_tokens": mean(split[cut]), "mean_split_fraction": mean(split[cut] / total[cut]),
            "mean_decode_share_alpha": mean(decode), "kv_streamed": streamed, "kv_bulk": bulk}


def _find(cluster: ClusterState, instance_id: int) -> InstanceState | None:
    by_id = getattr(cluster, "instance", None)
    if by_id is not None:
        return by_id(instance_id)
    return next((i for i in cluster.instances if i.instance_id == instance_id), None)


def _kv_use(inst: InstanceState) -> float:
    blocks = inst.blocks
    return 1.0 - blocks.num_free_gpu_blocks / max(blocks.num_gpu_blocks, 1)


@register_preset("dynaserve")
def _dynaserve(num_instances: int, params: dict[str, Any], group: dict[str, Any], link: LinkSpec) -> ClusterConfig:
    """Unified instances running the ``dynaserve`` local scheduler behind the ``dynaserve``
    router; a parameter goes to whichever of the two takes it (``tbt_slo_s`` and
    ``headroom`` to both)."""
    import dataclasses

    policy_keys = {f.name for f in dataclasses.fields(DynaServePolicyConfig)}
    router_keys = {f.name for f in dataclasses.fields(DynaServeRouterConfig)}
    unknown = sorted(set(params) - policy_keys - router_keys)
    if unknown:
        raise RegistryError(f"preset 'dynaserve' has no parameter {unknown[0]!r}; valid: "
                            f"{', '.join(sorted(policy_keys | router_keys))}")
    policy = {k: v for k, v in params.items() if k in policy_keys}
    router = {k: v for k, v in params.items() if k in router_keys}
    return ClusterConfig(groups=(InstanceGroup(count=num_instances, policy="dynaserve", policy_params=policy,
                                               **group),), router="dynaserve", router_params=router, link=link)
