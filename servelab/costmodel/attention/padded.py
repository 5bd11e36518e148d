"""A dense kernel over a padded [rows, longest context] tensor.

What a gather of every row's KV into one rectangle followed by a dense attention does (our
CPU engine, and any SDPA call over a padded batch): every row reads as many tokens as the
longest one, so the cost is rows x longest whatever the other contexts are.
"""

from __future__ import annotations

from servelab.costmodel.attention.base import KernelCoefficients


class PaddedKernel:
    name = "padded"

    def __init__(self, coefficients: KernelCoefficients) -> None:
        self.coefficients = coefficients
        c = coefficients
        self._floor, self._kv, self._row = c.floor_s, c.kv_read_s, c.row_s

    def decode_s(self, num_decodes, context_sum, context_max):
        return self._floor + self._row * num_decodes + self._kv * (num_decodes * context_max)
