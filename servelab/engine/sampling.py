"""Token sampling: greedy, temperature, top-k, top-p, with per-request deterministic seeds.

``Sampler.sample`` takes one logits row per request. Greedy rows (temperature 0) take the
argmax. The others are scaled by temperature, masked by top-k and top-p (one shared sort),
and sampled by the exponential race (argmax of ``p / E`` with ``E ~ Exp(1)``), which equals
sampling from ``p``. A request with a ``seed`` owns a ``torch.Generator`` seeded once and
advanced by exactly one draw of ``vocab`` exponentials per sampled token, so its tokens do
not depend on which other requests share the batch. Unseeded rows share the sampler's
generator. Call ``release`` when a request ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from servelab.core.errors import UserError


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request sampling (vLLM's names); a bad value is a ``UserError`` naming the field."""

    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0 disables
    top_p: float = 1.0  # 1 disables
    seed: int | None = None
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()  # stop strings; the output text is cut before the match
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise UserError(f"sampling temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise UserError(f"sampling top_k must be >= 0 (0 disables), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise UserError(f"sampling top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise UserError(f"sampling max_tokens must be >= 1, got {self.max_tokens}")
        if any(not s for s in self.stop):
            raise UserError("sampling stop strings must be non-empty")
        if isinstance(self.stop, str) or isinstance(self.stop_token_ids, int):
            raise TypeError("stop and stop_token_ids must be tuples")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


GREEDY = SamplingParams(temperature=0.0)


def top_k_top_p_mask(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Logits with tokens outside each row's top-k / top-p set at -inf.

    logits: [R, V] float; top_k: [R] long (0 = off); top_p: [R] float (1 = off). The top-p set
    is the smallest prefix of the sorted distribution whose mass reaches p (never empty).
    """
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [R, V]
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device)
    k = torch.where(top_k > 0, top_k, vocab).unsqueeze(1)  # [R, 1]
    sorted_logits = sorted_logits.masked_fill(ranks >= k, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # [R, V]
    sorted_logits = sorted_logits.masked_fill(mass_before >= top_p.unsqueeze(1), float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)


class Sampler:
    def __init__(self, seed: int = 0, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self._shared = torch.Generator(device=self.device).manual_seed(seed)
        self._generators: dict[int, torch.Generator] = {}

    def release(self, request_id: int) -> None:
        self._generators.pop(request_id, None)

    def sample(self, logits: torch.Tensor, request_ids: Sequence[int],
               params: Sequence[SamplingParams]) -> list[int]:
        # logits: [R, V] float32, row i belongs to request_ids[i]
        if not (len(request_ids) == len(params) == logits.shape[0]):
            raise ValueError("logits rows, request_ids and params must have the same length")
        out = logits.argmax(dim=-1)  # [R]
        rows = [i for i, p in enumerate(params) if not p.is_greedy]
        if rows:
            idx = torch.tensor(rows, device=logits.device)
            chosen = [params[i] for i in rows]
            temps = torch.tensor([p.temperature for p in chosen], device=logits.device)
            scaled = logits.index_select(0, idx) / temps.unsqueeze(1)  # [r, V]
            if any(p.top_k or p.top_p < 1 for p in chosen):
                top_k = torch.tensor([p.top_k for p in chosen], device=logits.device)
                top_p = torch.tensor([p.top_p for p in chosen], device=logits.device)
                scaled = top_k_top_p_mask(scaled, top_k, top_p)
            probs = scaled.softmax(dim=-1)
            noise = self._exponentials([request_ids[i] for i in rows], chosen, probs.shape[1])  # [r, V]
            out[idx] = (probs / noise).argmax(dim=-1)
        return out.tolist()

    def _exponentials(self, request_ids: list[int], params: list[SamplingParams], vocab: int) -> torch.Tensor:
        noise = torch.empty(len(params), vocab, device=self.device)
        shared = [i for i, p in enumerate(params) if p.seed is None]
        if shared:
            draws = torch.empty(len(shared), vocab, device=self.device).exponential_(generator=self._shared)
            noise[shared] = draws
        for i, (rid, p) in enumerate(zip(request_ids, params)):
            if p.seed is not None:
                gen = self._generators.get(rid)
                if gen is None:
                    gen = self._generators[rid] = torch.Generator(device=self.device).manual_seed(p.seed)
                noise[i].exponential_(generator=gen)
        return noise


def finish_reason(params: SamplingParams, token_id: int, num_generated: int,
                  eos_token_ids: tuple[int, ...]) -> str | None:
    """Why a request stops after emitting ``token_id`` as its ``num_generated``-th token, or None.

    Stop strings are the detokenizer's business (they need text); this covers ids and length.
    """
    if token_id in eos_token_ids and not params.ignore_eos:
        return "eos"
    if token_id in params.stop_token_ids:
        return "stop_token"
    if num_generated >= params.max_tokens:
        return "length"
    return None
