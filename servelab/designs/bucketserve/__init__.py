"""BucketServe: the bucket manager (Alg. 1), padding analysis (Eqs. 2-4), the batching
controller math (Eqs. 1, 5, 6), the global monitor, the overhead benchmark and the policy
that wires them together (plus the ``bucketserve-pd`` cluster preset).

The building blocks are pure Python + numpy: no simulator and no torch. UELLM, the
paper's baseline, lives in ``servelab.baselines.uellm``.
"""

from servelab.designs.bucketserve import policy  # noqa: F401  (register policy and preset)
