"""Model runner: one forward step over a batch of sequence chunks, then sampling.

The runner knows nothing about scheduling. The executor hands it, per request, the tokens
to compute this step, the position of the first one (= tokens whose KV already exists) and
the request's block table from ``BlockManager``; it builds the attention metadata, runs the
model over the paged cache and samples. A chunk with ``sample=False`` (a prefill chunk that
does not finish the prompt) writes its KV and returns no token.

Ragged steps put single-token decodes first, longest context first, so that the rows reaching
any KV split are a prefix (``attention.split_kv_decode``); results come back keyed by request
id, so the reordering is invisible. Padded steps
run ``[num_rows, row_tokens]`` with ``context_tokens`` keys per row, as ``PaddedBatch`` says.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from servelab.engine.attention import (DECODE_KERNELS, SPLIT_MERGE, SPLIT_MERGE_BYTES, SPLIT_TOKENS, DecodeSplit,
                                      GatherWorkspace,
                                      PaddedMetadata, PrefillChunk, RaggedMetadata, cpu_inplace_decode, cpu_split_bmm,
                                      head_index)
from servelab.engine.kv_cache import PagedKVCache
from servelab.engine.model import Model
from servelab.engine.sampling import GREEDY, Sampler, SamplingParams


@dataclass(frozen=True, slots=True)
class SeqChunk:
    request_id: int
    token_ids: Sequence[int]  # tokens to compute this step
    start_pos: int  # position of token_ids[0]; KV of positions [0, start_pos) is cached
    block_table: Sequence[int]  # must cover start_pos + len(token_ids) slots
    sample: bool = True

    @property
    def end_pos(self) -> int:
        return self.start_pos + len(self.token_ids)


def _check(chunks: Sequence[SeqChunk], block_size: int) -> None:
    seen = set()
    for c in chunks:
        if not c.token_ids:
            raise ValueError(f"request {c.request_id}: no tokens to compute")
        if c.start_pos < 0:
            raise ValueError(f"request {c.request_id}: start_pos must be >= 0, got {c.start_pos}")
        if len(c.block_table) * block_size < c.end_pos:
            raise ValueError(f"request {c.request_id}: block table of {len(c.block_table)} blocks holds "
                             f"{len(c.block_table) * block_size} slots, needs {c.end_pos}")
        if c.request_id in seen:
            raise ValueError(f"request {c.request_id} appears twice in one step")
        seen.add(c.request_id)


def _padded_tables(tables: Sequence[Sequence[int]], width: int, device: torch.device) -> torch.Tensor:
    rows = [list(t[:width]) + [0] * (width - min(len(t), width)) for t in tables]
    return torch.tensor(rows, dtype=torch.long, device=device)  # [B, width]


def decode_splits(tables: torch.Tensor, ends: Sequence[int], block_size: int, split_tokens: int,
                  dtype: torch.dtype, kv_heads: int | None = None, merge: int = SPLIT_MERGE,
                  token_bytes: int | None = None, merge_bytes: int = SPLIT_MERGE_BYTES) -> tuple[DecodeSplit, ...]:
    """The split-kv kernel's splits for decode rows ordered longest first. tables: [B, width]
    padded block tables; ends: each row's context length (its position + 1). Units of
    ``split_tokens`` that the same rows reach are merged, up to ``merge`` units a split (fewer
    splits, each a larger batched matmul; a split still never holds a row that ends before it).
    With ``kv_heads`` (on the CPU, where ``dtype`` runs the batched-matmul kernel) each split
    also carries its head-major gather index, built once for every layer. With ``token_bytes``
    (K and V of one token, all KV heads, in the cache) a merge also stops where the split's
    gather would pass ``merge_bytes``."""
    per = max(1, split_tokens // block_size)
    width = tables.shape[1]
    keys = torch.arange(width * block_size, device=tables.device)
    ends_t = torch.tensor(list(ends), device=tables.device)
    bias = torch.zeros(len(ends), width * block_size, dtype=dtype, device=tables.device)  # [B, C]
    bias.masked_fill_(keys.unsqueeze(0) >= ends_t.unsqueeze(1), float("-inf"))
    splits = []
    first = 0
    while first < width:
        rows = sum(1 for e in ends if e > first * block_size)
        n = per
        while first + n < width and n < per * merge and ends[rows - 1] > (first + n) * block_size \
                and (token_bytes is None or rows * (n + per) * block_size * token_bytes <= merge_bytes):
            n += per  # the next unit holds the same rows (the shortest of them reaches past it)
        n = min(n, width - first)
        split_bias = None
        if ends[rows - 1] < (first + n) * block_size:  # the shortest row ends inside this split
            split_bias = bias[:rows, first * block_size:(first + n) * block_size].reshape(rows, 1, 1, -1)
        table = tables[:rows, first:first + n].contiguous()
        cpu_bmm = kv_heads and tables.device.type == "cpu" and cpu_split_bmm(dtype)
        index = head_index(table, block_size, kv_heads) if cpu_bmm else None
        splits.append(DecodeSplit(rows, table, split_bias, index))
        first += n
    return tuple(splits)


def build_ragged(chunks: Sequence[SeqChunk], block_size: int, device: torch.device,
                 workspace: GatherWorkspace | None = None, *, decode_kernel: str = "split-kv",
                 split_tokens: int = SPLIT_TOKENS, dtype: torch.dtype = torch.float32, kv_heads: int | None = None,
                 split_merge: int = SPLIT_MERGE, token_bytes: int | None = None, head_dim: int | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, RaggedMetadata, list[SeqChunk]]:
    """Flatten chunks (decodes first, longest first) into input_ids [T], positions [T] and
    metadata for ``decode_kernel`` (``dtype``: the cache's, for the split-kv mask). With
    ``head_dim``, split-kv decodes read the cache in place where ``cpu_inplace_decode`` says so."""
    _check(chunks, block_size)
    decodes = sorted((c for c in chunks if len(c.token_ids) == 1 and c.start_pos > 0), key=lambda c: -c.end_pos)
    prefills = [c for c in chunks if not (len(c.token_ids) == 1 and c.start_pos > 0)]
    ordered = decodes + prefills
    ids = [t for c in ordered for t in c.token_ids]
    positions = torch.tensor([p for c in ordered for p in range(c.start_pos, c.end_pos)], dtype=torch.long)
    slots, rows, logits_rows = [], 0, []
    decode_tables = decode_mask = decode_lens = None
    splits: tuple[DecodeSplit, ...] = ()
    if decodes:
        width = max(-(-c.end_pos // block_size) for c in decodes)
        decode_tables = _padded_tables([c.block_table for c in decodes], width, device)
        pos = positions[:len(decodes)].to(device)
        slots.append(decode_tables.gather(1, (pos // block_size).unsqueeze(1)).squeeze(1) * block_size
                     + pos % block_size)
        if decode_kernel == "split-kv" and cpu_inplace_decode(device, dtype, head_dim):
            decode_lens = pos + 1
        elif decode_kernel == "split-kv":
            splits = decode_splits(decode_tables, [c.end_pos for c in decodes], block_size, split_tokens, dtype,
                                   kv_heads, split_merge, token_bytes)
            decode_tables = None
        else:
            keys = torch.arange(width * block_size, device=device)
            decode_mask = (keys.unsqueeze(0) <= pos.unsqueeze(1)).view(len(decodes), 1, 1, -1)
        logits_rows += [i for i, c in enumerate(decodes) if c.sample]
        rows = len(decodes)
    chunk_meta = []
    for c in prefills:
        n = len(c.token_ids)
        table = torch.tensor(c.block_table[:-(-c.end_pos // block_size)], dtype=torch.long, device=device)
        pos = torch.arange(c.start_pos, c.end_pos, device=device)
        slots.append(table[pos // block_size] * block_size + pos % block_size)
        bias = None
        if c.start_pos:
            future = torch.arange(c.end_pos, device=device).unsqueeze(0) > pos.unsqueeze(1)  # [n, end_pos]
            bias = torch.zeros(future.shape, dtype=dtype, device=device).masked_fill_(future, float("-inf"))
        chunk_meta.append(PrefillChunk(rows, n, c.end_pos, table, bias))
        rows += n
        if c.sample:
            logits_rows.append(rows - 1)
    meta = RaggedMetadata(slot_mapping=torch.cat(slots),
                          logits_indices=torch.tensor(logits_rows, dtype=torch.long, device=device),
                          num_decodes=len(decodes), decode_block_tables=decode_tables, decode_mask=decode_mask,
                          prefills=tuple(chunk_meta), decode_splits=splits, workspace=workspace,
                          decode_lens=decode_lens)
    sampled = [c for c in ordered if c.sample]
    return torch.tensor(ids, dtype=torch.long, device=device), positions.to(device), meta, sampled


def build_padded(chunks: Sequence[SeqChunk], num_rows: int, row_tokens: int, context_tokens: int,
                 block_size: int, device: torch.device, workspace: GatherWorkspace | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, PaddedMetadata, list[SeqChunk]]:
    """Dense [num_rows, row_tokens] batch; rows past the chunks are pure padding."""
    _check(chunks, block_size)
    if len(chunks) > num_rows:
        raise ValueError(f"{len(chunks)} sequences do not fit in {num_rows} padded rows")
    for c in chunks:
        if len(c.token_ids) > row_tokens or c.end_pos > context_tokens:
            raise ValueError(f"request {c.request_id}: {len(c.token_ids)} tokens ending at {c.end_pos} exceed "
                             f"the padded shape ({row_tokens} tokens, {context_tokens} context)")
    width = -(-context_tokens // block_size)
    ids = torch.zeros(num_rows, row_tokens, dtype=torch.long)
    positions = torch.zeros(num_rows, row_tokens, dtype=torch.long)
    last_key = torch.zeros(num_rows, row_tokens, dtype=torch.long)  # keys [0, last_key] are visible
    write_rows, logits_rows = [], []
    for b, c in enumerate(chunks):
        n = len(c.token_ids)
        ids[b, :n] = torch.tensor(list(c.token_ids))
        positions[b, :n] = torch.arange(c.start_pos, c.end_pos)
        last_key[b, :n] = positions[b, :n]
        write_rows += range(b * row_tokens, b * row_tokens + n)
        if c.sample:
            logits_rows.append(b * row_tokens + n - 1)
    tables = _padded_tables([c.block_table for c in chunks] + [[]] * (num_rows - len(chunks)), width, device)
    write_rows_t = torch.tensor(write_rows, dtype=torch.long, device=device)
    flat_pos = positions.to(device).flatten().index_select(0, write_rows_t)
    row_of = write_rows_t // row_tokens
    write_slots = tables[row_of, flat_pos // block_size] * block_size + flat_pos % block_size
    keys = torch.arange(width * block_size, device=device)
    mask = keys.view(1, 1, -1) <= last_key.to(device).unsqueeze(2)  # [B, S, C]
    meta = PaddedMetadata(block_tables=tables, mask=mask.unsqueeze(1), write_rows=write_rows_t,
                          write_slots=write_slots,
                          logits_indices=torch.tensor(logits_rows, dtype=torch.long, device=device),
                          workspace=workspace)
    return ids.to(device), positions.to(device), meta, [c for c in chunks if c.sample]


class ModelRunner:
    """Runs steps of ``model`` over ``kv_cache``; with ``layers=(lo, hi)`` it is one pipeline
    stage: the cache holds only those layers and ``run_stage`` hands hidden states on.
    ``decode_kernel`` picks the ragged steps' decode attention (``attention.DECODE_KERNELS``);
    padded steps always run the padded layout their policy asked for."""

    def __init__(self, model: Model, kv_cache: PagedKVCache, sampler: Sampler | None = None, *,
                 layers: tuple[int, int] | None = None, decode_kernel: str = "split-kv",
                 split_tokens: int = SPLIT_TOKENS) -> None:
        if decode_kernel not in DECODE_KERNELS:
            raise ValueError(f"decode_kernel must be one of {DECODE_KERNELS}, got {decode_kernel!r}")
        if split_tokens < 1:
            raise ValueError(f"split_tokens must be >= 1, got {split_tokens}")
        num_layers = model.config.num_layers if layers is None else layers[1] - layers[0]
        if layers is not None and not 0 <= layers[0] < layers[1] <= model.config.num_layers:
            raise ValueError(f"layers {layers} is not a non-empty range of the model's {model.config.num_layers}")
        if kv_cache.num_layers != num_layers or kv_cache.head_dim != model.config.head_dim \
                or kv_cache.num_kv_heads != model.config.num_kv_heads:
            raise ValueError("KV cache shape does not match the model config")
        self.layers = layers
        self.model = model
        self.kv_cache = kv_cache
        self.device = kv_cache.device
        self.sampler = sampler or Sampler(device=self.device)
        self.workspace = GatherWorkspace()  # reused by every layer of every step
        self.decode_kernel = decode_kernel
        self.split_tokens = split_tokens
        cache = kv_cache  # K and V of one token in one layer: what a decode split gathers per token
        self._token_bytes = 2 * cache.num_kv_heads * cache.head_dim * torch.empty(0, dtype=cache.dtype).element_size()

    def _build_ragged(self, chunks: Sequence[SeqChunk]):
        return build_ragged(chunks, self.kv_cache.block_size, self.device, self.workspace,
                            decode_kernel=self.decode_kernel, split_tokens=self.split_tokens, dtype=self.kv_cache.dtype,
                            kv_heads=self.kv_cache.num_kv_heads, token_bytes=self._token_bytes,
                            head_dim=self.kv_cache.head_dim)

    @torch.inference_mode()
    def compute_logits(self, chunks: Sequence[SeqChunk]) -> tuple[list[int], torch.Tensor]:
        """Request ids of the sampled chunks, and their logits [R, vocab] float32 in that order."""
        if not chunks:
            return [], torch.empty(0, self.model.config.vocab_size)
        ids, positions, meta, sampled = self._build_ragged(chunks)
        logits = self.model(ids, positions, self.kv_cache.kv, meta)
        return [c.request_id for c in sampled], logits

    @torch.inference_mode()
    def compute_logits_padded(self, chunks: Sequence[SeqChunk], num_rows: int, row_tokens: int,
                              context_tokens: int) -> tuple[list[int], torch.Tensor]:
        ids, positions, meta, sampled = build_padded(chunks, num_rows, row_tokens, context_tokens,
                                                     self.kv_cache.block_size, self.device, self.workspace)
        logits = self.model.forward_padded(ids, positions, self.kv_cache.kv, meta)
        return [c.request_id for c in sampled], logits

    @torch.inference_mode()
    def run_stage(self, chunks: Sequence[SeqChunk], hidden: torch.Tensor | None = None
                  ) -> tuple[list[int], torch.Tensor]:
        """This stage's layers over a ragged step: the sampled request ids and the logits (last
        stage) or the hidden state [T, hidden] for the next stage (same row order every stage)."""
        if self.layers is None:
            raise ValueError("run_stage needs a runner built with layers=(lo, hi)")
        ids, positions, meta, sampled = self._build_ragged(chunks)
        if hidden is not None:
            hidden = hidden.to(self.device)
        out = self.model.forward_layers(ids, positions, self.kv_cache.kv, meta, self.layers, hidden)
        return [c.request_id for c in sampled], out

    def run(self, chunks: Sequence[SeqChunk], sampling: Mapping[int, SamplingParams] | None = None
            ) -> dict[int, int]:
        """One ragged step; returns the next token of every chunk with ``sample=True``."""
        return self._sample(*self.compute_logits(chunks), sampling)

    def run_padded(self, chunks: Sequence[SeqChunk], num_rows: int, row_tokens: int, context_tokens: int,
                   sampling: Mapping[int, SamplingParams] | None = None) -> dict[int, int]:
        return self._sample(*self.compute_logits_padded(chunks, num_rows, row_tokens, context_tokens), sampling)

    def release(self, request_id: int) -> None:
        self.sampler.release(request_id)

    def _sample(self, request_ids: list[int], logits: torch.Tensor,
                sampling: Mapping[int, SamplingParams] | None) -> dict[int, int]:
        if not request_ids:
            return {}
        params = [(sampling or {}).get(rid, GREEDY) for rid in request_ids]
        return dict(zip(request_ids, self.sampler.sample(logits, request_ids, params)))
