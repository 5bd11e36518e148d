"""BucketServe building blocks: the bucket manager (Alg. 1), padding analysis (Eqs. 2-4),
the batching controller math (Eqs. 1, 5, 6), the global monitor and the overhead benchmark.

All pure Python + numpy, no simulator and no torch; the policy in
``servelab.policies.bucketserve`` wires them together.
"""
