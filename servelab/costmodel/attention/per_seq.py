"""One thread block per (sequence, query head): vLLM's PagedAttention V1.

Blocks of short sequences finish early and their SMs idle while the longest sequence's
blocks, one SM each, read its whole KV at about 1/num_SMs of the bandwidth. The kernel is
bounded below by ``longest * longest_factor`` context tokens of full-GPU time, so

    floor + row * rows + kv_read * max(sum of contexts, longest * longest_factor)

which is the sum for large mixed batches and the longest row for a few long requests
among short ones (the iteration bubble AlignedServe removes by aligning batches).
"""

from __future__ import annotations

from servelab.costmodel.attention.base import KernelCoefficients, bubble_work


class PerSeqKernel:
    name = "per-seq"

    def __init__(self, coefficients: KernelCoefficients) -> None:
        self.coefficients = coefficients
        c = coefficients
        self._floor, self._kv, self._row, self._factor = c.floor_s, c.kv_read_s, c.row_s, c.longest_factor

    def decode_s(self, num_decodes, context_sum, context_max):
        return self._floor + self._row * num_decodes + self._kv * bubble_work(context_sum, context_max * self._factor)
