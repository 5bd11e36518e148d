"""DynaServe: micro-requests split at any token across two instances (the ``dynaserve``
router, Algorithm 1 over a virtual-pass predictor), SLO-aware batch composition on each
instance (the ``dynaserve`` policy, Algorithm 2 over a profile table), KV streamed in chunks
while alpha computes (the cluster layer's hand-offs), and the ``dynaserve`` cluster preset.

The building blocks (profile table, timeline, split search) are numpy only: no torch.
"""

from servelab.designs.dynaserve import policy, router  # noqa: F401  (register policy, router and preset)
