"""Split-KV decode (FlashDecoding, FlashInfer, PagedAttention V2, FlashAttention-3).

Each sequence's KV is cut into chunks and the chunks of all sequences are spread over every
SM, then partial results are merged per row: the kernel reads the sum of the contexts at
full bandwidth, whatever their spread, plus a per-row merge. A long request among short ones
costs its own tokens and no more.
"""

from __future__ import annotations

from servelab.costmodel.attention.base import KernelCoefficients


class SplitKVKernel:
    name = "split-kv"

    def __init__(self, coefficients: KernelCoefficients) -> None:
        self.coefficients = coefficients
        c = coefficients
        self._floor, self._kv, self._row = c.floor_s, c.kv_read_s, c.row_s

    def decode_s(self, num_decodes, context_sum, context_max):
        return self._floor + self._row * num_decodes + self._kv * context_sum
