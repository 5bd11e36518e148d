"""The numbers before issue 10's changes, for the report's before/after columns.

``COMMITTED``: the claims table of ``docs/reproduction/bucketserve.md`` as committed in
fd09caa (the old simulator driver): static = arrival-order static batching standing in for
UELLM (batch 32 online), padded bucket prefills, Eq. 5 applied on top of the instance
reserve, N_max not capped by the step limit, ratios taken at the best point of each sweep.

``RERUN``: the same code (commit c9a38a1) rerun on the new cluster driver with
``servelab reproduce bucketserve --seed 0`` before any change of this issue.

Keys are the claim keys of ``report.CLAIMS``; None where that run had no such figure.
These are records of past runs, quoted, not recomputed.
"""

from __future__ import annotations

COMMITTED = {
    "offline_vs_uellm": 9.023, "offline_vs_distserve": 0.991, "gpu_util": 0.763,
    "slo80_alpaca": 1.005, "slo80_mixed": 0.427, "rps_vs_uellm_alpaca": 5.098,
    "rps_vs_uellm_mixed": 9.856, "rps_vs_distserve_mixed": 0.951, "overhead": 0.001, "decode_share": 0.997,
    "follows_client_alpaca": None, "follows_client_mixed": None,
}

RERUN = {
    "offline_vs_uellm": 8.639, "offline_vs_distserve": 1.194, "gpu_util": 0.814,
    "slo80_alpaca": 0.890, "slo80_mixed": 0.873, "rps_vs_uellm_alpaca": 4.850,
    "rps_vs_uellm_mixed": 9.588, "rps_vs_distserve_mixed": 1.083, "overhead": 0.001, "decode_share": 0.997,
    "follows_client_alpaca": None, "follows_client_mixed": None,
}
