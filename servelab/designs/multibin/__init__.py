"""Multi-Bin Batching (Guldogan et al.): bins on predicted output length, batches formed inside
a bin, first-completed-batch-first-served; closed forms (``theory``) and a batch-level queue
simulator (``queue_sim``) cross-checked against the token-level simulator.
"""

from servelab.designs.multibin import policy, router  # noqa: F401  (register policy, router, preset)
