"""AlignedServe: prefix-length-aligned decode batches cut by Density First Search over a
quad-tree of the requests parked in the cluster's host KV pool, scheduled batch by batch
(Algorithm 2) through candidate buffers that a prefill GPU prefetches for a decode GPU.

The building blocks (quad-tree, config, stats) are pure Python: no torch.
"""

from servelab.designs.alignedserve import policy, router  # noqa: F401  (register policy, router and preset)
