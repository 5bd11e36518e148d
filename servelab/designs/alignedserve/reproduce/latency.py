"""Per-request latency split the same way for every system: the wait before decoding, and TPOT.

The paper's P99 TPOT "characterizes the latency of each decoding iteration" (Section 4.3),
and batching in the pool "deteriorates the TTFT" (Section 4.5, Fig. 15): the pool wait is
TTFT's, not TPOT's. Here every P/D system's prefill emits the first token (DistServe's
convention), so the wait between prefill and the first decode iteration (AlignedServe's
pool, DistServe's queue for decode memory, a mixed instance's next iteration) falls between
the first and the second token. TPOT therefore starts at the second token (the first one a
decode iteration made): ``(t[-1] - t[1]) / (n - 2)`` over requests with three tokens or
more, for every system alike. The first-to-second-token wait is reported on its own, and
the old definition (from the first token) is kept beside it, so the split can be checked:
if the old P99 is set by the wait, its top requests are short ones whose time is the wait.
"""

from __future__ import annotations

import numpy as np

KEYS = ("tpot_p50_ms", "tpot_p99_ms", "tpot_from_first_p99_ms", "first_gap_p50_s", "first_gap_p99_s",
        "decode_gap_p99_ms", "decode_gap_max_p99_s", "top1_output_tokens", "top1_first_gap_share", "num_tpot")


def split(token_times: list[np.ndarray]) -> dict:
    """``token_times``: each finished request's token timestamps (seconds). -> P50/P99 of
    TPOT from the second token (ms), P99 of TPOT from the first token (ms, the old
    definition), the first-to-second-token wait (s), P99 of every gap between decode tokens
    (ms, each decoding iteration as a request saw it), P99 of each request's longest decode
    gap (s), and, for the top 1% of requests by the old TPOT, their median output length and
    the median share of their time that was the first-to-second-token wait."""
    nan = float("nan")
    two = [t for t in token_times if len(t) > 1]
    three = [t for t in two if len(t) > 2]
    if not two:
        return {**{k: nan for k in KEYS}, "num_tpot": 0}
    old = np.array([(t[-1] - t[0]) / (len(t) - 1) for t in two])
    first = np.array([t[1] - t[0] for t in two])
    tpot = np.array([(t[-1] - t[1]) / (len(t) - 2) for t in three])
    gaps = np.concatenate([np.diff(t[1:]) for t in three]) if three else np.zeros(0)
    worst = np.array([np.diff(t[1:]).max() for t in three])
    top = np.argsort(old, kind="stable")[-max(1, int(np.ceil(0.01 * len(old)))):]
    span = np.array([t[-1] - t[0] for t in two])[top]
    q = (lambda x, p: float(np.percentile(x, p)) if len(x) else nan)
    return {
        "tpot_p50_ms": 1e3 * q(tpot, 50), "tpot_p99_ms": 1e3 * q(tpot, 99),
        "tpot_from_first_p99_ms": 1e3 * q(old, 99),
        "first_gap_p50_s": q(first, 50), "first_gap_p99_s": q(first, 99),
        "decode_gap_p99_ms": 1e3 * q(gaps, 99), "decode_gap_max_p99_s": q(worst, 99),
        "top1_output_tokens": float(np.median([len(two[i]) for i in top])),
        "top1_first_gap_share": float(np.median(first[top] / np.maximum(span, 1e-12))),
        "num_tpot": len(three),
    }
