"""Algorithm 1: where to split one request between its two instances.

A request of prompt ``P`` and predicted total ``N = P + D`` tokens is split at ``s`` in
``[0, N]``: alpha computes tokens ``[0, s)`` on one instance, beta ``[s, N)`` on the other
once alpha's KV has arrived. The search starts at ``s = P`` (classic disaggregation) and
bisects: when alpha's instance would have more work ahead than beta's, ``s`` moves down,
otherwise up, for at most ``max_probes`` probes or until the two are within ``tolerance``;
the probe with the smallest gap wins.

Work, not finish time: beta's finish includes waiting for alpha's part, which would make a
prefill-bound alpha look idle; balancing the work ahead is what keeps neither instance
idle (the paper's Insight 1). Each instance's work ahead comes from its ``Timeline`` (the
virtual passes already laid, reused across requests) and what a part adds is linear in its
tokens (``Timeline.segment_work``), so a probe is a few multiplications; where and when the
chosen parts land is worked out once, when they are placed.
"""

from __future__ import annotations

from typing import NamedTuple

from servelab.designs.dynaserve.timeline import Segment, Timeline


class SplitChoice(NamedTuple):
    split_tokens: int  # s: alpha computes [0, s), beta [s, N)
    alpha_work_s: float  # work ahead of alpha's instance with its part added
    beta_work_s: float
    num_probes: int


def segments_for(split: int, prompt: int, total: int, now_s: float, beta_ready_s: float
                 ) -> tuple[Segment | None, Segment | None]:
    """The two micro-requests of a request split at ``split`` (None for an empty side)."""
    alpha = alpha_segment(split, prompt, now_s) if split > 0 else None
    beta = beta_segment(split, prompt, total, now_s, beta_ready_s) if split < total else None
    return alpha, beta


def alpha_segment(split: int, prompt: int, now_s: float) -> Segment:
    """``segments_for``'s alpha part (``split > 0``), built alone: a decision needs each once."""
    return Segment(now_s, min(split, prompt), max(0, split - prompt), prompt)


def beta_segment(split: int, prompt: int, total: int, now_s: float, beta_ready_s: float) -> Segment:
    """``segments_for``'s beta part (``split < total``)."""
    return Segment(beta_ready_s if split > 0 else now_s, max(0, prompt - split), total - max(split, prompt),
                   max(split, prompt))


def work_after(split: int, prompt: int, total: int, alpha: Timeline, beta: Timeline) -> tuple[float, float]:
    """Work ahead of (alpha, beta) with the request split at ``split``."""
    a = alpha.work_s + (alpha.segment_work(min(split, prompt), max(0, split - prompt), prompt) if split > 0 else 0.0)
    b = beta.work_s
    if split < total:
        b += beta.segment_work(max(0, prompt - split), total - max(split, prompt), max(split, prompt))
    return a, b


def choose_split(prompt: int, total: int, alpha: Timeline, beta: Timeline, *, max_probes: int = 6,
                 tolerance: float = 0.02) -> SplitChoice:
    """The bounded bisection of Algorithm 1 over ``s`` in [0, total], starting at ``prompt``.

    Each probe is ``work_after``'s arithmetic on the two instances' work ahead and linear
    costs, read once per search (the same operations in the same order, so the same
    floats: ``tests/designs/dynaserve/test_fast_paths.py`` pins it against ``work_after``)."""
    wa, wb = alpha.work_s, beta.work_s
    ca, cb = alpha.coef, beta.coef
    pa, ra, xa = ca.full_pass_token_s, ca.row_s + ca.base_s / ca.full_rows, ca.row_ctx_s  # base / rows: decode_share_s
    pb, rb, xb = cb.full_pass_token_s, cb.row_s + cb.base_s / cb.full_rows, cb.row_ctx_s
    lo, hi = 0, total
    split = min(prompt, total)
    best_split, best_a, best_b = split, float("nan"), float("nan")
    best_gap = float("inf")
    tried: set[int] = set()
    n = 0
    for n in range(1, max_probes + 1):
        tried.add(split)
        if split > 0:  # alpha: segment_work(min(s, P), max(0, s - P), P)
            d = split - prompt if split > prompt else 0
            a = wa + ((split if split < prompt else prompt) * pa + d * (ra + xa * (prompt + (d - 1) / 2)))
        else:
            a = wa + 0.0  # as work_after
        if split < total:  # beta: segment_work(max(0, P - s), N - max(s, P), max(s, P))
            m = split if split > prompt else prompt
            d = total - m
            b = wb + ((prompt - split if prompt > split else 0) * pb + d * (rb + xb * (m + (d - 1) / 2)))
        else:
            b = wb
        gap = a - b
        size = gap if gap >= 0 else -gap  # abs() and max() spelled out: the same comparisons, no calls
        if size < best_gap:
            best_gap = size
            best_split, best_a, best_b = split, a, b
        if size <= tolerance * (b if b > a else a):
            break
        if gap > 0:
            hi = split
        else:
            lo = split
        nxt = (lo + hi) // 2
        if nxt in tried:
            nxt = nxt + 1 if gap < 0 else nxt - 1
            if nxt in tried or not lo <= nxt <= hi:
                break
        split = nxt
    return SplitChoice(best_split, best_a, best_b, n)
