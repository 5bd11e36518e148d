"""Decode kernels and GEMMs of the engine on this CPU; writes docs/benchmarks/decode_kernels.md.

    python scripts/decode_kernels.py [--repeats 5] [--rounds 3] [--no-flex]

1. Projections: ``F.linear`` against the oneDNN-packed weights the engine now uses on CPU, at
   the bench-200m shapes, fp32 and bf16, 32 and 2,048 rows.
2. Decode attention of one layer (bench-200m heads, block size 16, scattered blocks): the
   padded kernel, the split-kv kernel at several split sizes, and ``flex_attention`` compiled
   over a dense (unpaged) KV as the bound a compiled kernel could reach; uniform, one long row
   among short ones, and spread contexts.
3. Whole decode steps of bench-200m (batch 32 at context 256 and 1,152) per kernel, the kernels
   alternated round by round in one process, against this
   CPU's roofline: max(bytes a step must read / measured read bandwidth, FLOPs / the best
   measured single-core GEMM rate). All timings are CPU time of one thread, medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "docs" / "benchmarks" / "decode_kernels.md"

from servelab.engine import attention  # noqa: E402
from servelab.engine.attention import GatherWorkspace  # noqa: E402
from servelab.engine.device import cpu_description, cpu_has_bf16  # noqa: E402
from servelab.engine.bench import (  # noqa: E402
    cpu_ms_samples, median_cpu_ms as cpu_ms, random_model, read_bandwidth_bytes_per_s, step_bytes, step_flops)
from servelab.engine.kv_cache import PagedKVCache  # noqa: E402
from servelab.engine.runner import ModelRunner, SeqChunk, build_ragged  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 16, 4, 64, 16
PEAKS: dict[torch.dtype, float] = {}  # dtype -> fastest GEMM rate seen (GFLOP/s), filled by gemm_rates
CASES = {"uniform 32 x 1,152": [1152] * 32, "1 x 1,536 + 31 x 128": [1536] + [128] * 31,
         "spread 64..1,304": [64 + 40 * i for i in range(32)]}


def dtypes() -> tuple[torch.dtype, ...]:
    """float32, and bf16 where this CPU has oneDNN's bf16 path: without it (AVX2 only) oneDNN will
    not pack bf16 weights and the engine's benchmarks serve float32 (``device.cpu_serving_dtype``)."""
    return (torch.float32, torch.bfloat16) if cpu_has_bf16() else (torch.float32,)


def fastest_ms(fn, repeats: int) -> float:
    """The fastest of ``repeats`` calls in CPU ms (after a warm-up): for the roofline's compute peak,
    which is a bound, as the read bandwidth is the fastest of its runs."""
    return min(cpu_ms_samples(fn, repeats))


def gemm_rates(repeats: int) -> list[tuple[str, int, str, float, float]]:
    """(dtype, rows, weight, F.linear GFLOP/s, packed GFLOP/s) medians, and the fastest rate seen per
    dtype (the roofline's peak) in ``PEAKS``."""
    rows = []
    for dtype in dtypes():
        for n, k, name in ((3072, 1024, "qkv"), (5632, 1024, "gate_up"), (1024, 2816, "down")):
            w = torch.randn(n, k, dtype=dtype)
            packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
            for m in (32, 2048):
                x = torch.randn(m, k, dtype=dtype)
                flops = 2 * m * n * k
                plain = flops / cpu_ms(lambda: F.linear(x, w), repeats) / 1e6
                onednn = flops / cpu_ms(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
                                        repeats) / 1e6
                best = flops / min(fastest_ms(lambda: F.linear(x, w), repeats), fastest_ms(
                    lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), repeats)) / 1e6
                PEAKS[dtype] = max(PEAKS.get(dtype, 0.0), plain, onednn, best)
                rows.append((str(dtype).removeprefix("torch."), m, f"{name} [{n} x {k}]", plain, onednn))
    return rows


def _flash_splits(on: bool | str | None):
    """The split-kv kernel's CPU path: head-major gather + batched matmuls (False), the fused
    flash kernel on each split's block-major gather (True; also CUDA's path), the C kernel that
    reads the cache in place ("in place"), or None: the engine's choice
    (``attention.cpu_inplace_decode``, else ``attention.cpu_split_bmm`` per dtype)."""
    attention.CPU_INPLACE_DECODE = on is None or on == "in place"
    attention.CPU_SPLIT_BMM = None if on is None or on == "in place" else not on


def _engine_split(dtype: torch.dtype) -> str:
    if attention.cpu_inplace_decode(torch.device("cpu"), dtype, HEAD_DIM):
        return "split-kv in place (C)"
    return "split-kv bmm" if attention.cpu_split_bmm(dtype) else "split-kv flash"


def _label(kernel: str, flash: bool | str) -> str:
    if kernel == "padded":
        return "padded"
    return "split-kv " + ("in place (C)" if flash == "in place" else "flash" if flash else "bmm")


def attention_case(contexts: list[int], kernel: str, split_tokens: int, repeats: int,
                   flash: bool | str = False) -> float:
    gen = torch.Generator().manual_seed(0)
    num_blocks = sum(-(-c // BLOCK) for c in contexts) + 1
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables, used = [], 1
    for c in contexts:
        n = -(-c // BLOCK)
        tables.append([perm[b] for b in range(used, used + n)])
        used += n
    kv = torch.randn(2, num_blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=gen)
    chunks = [SeqChunk(i, [3], c - 1, t) for i, (c, t) in enumerate(zip(contexts, tables))]
    q, k, v = torch.randn(len(contexts), HEADS, HEAD_DIM), torch.randn(len(contexts), KV_HEADS, HEAD_DIM), \
        torch.randn(len(contexts), KV_HEADS, HEAD_DIM)
    _flash_splits(flash)
    try:
        _, _, meta, _ = build_ragged(chunks, BLOCK, torch.device("cpu"), GatherWorkspace(), decode_kernel=kernel,
                                     split_tokens=split_tokens, token_bytes=2 * KV_HEADS * HEAD_DIM * 4,
                                     head_dim=HEAD_DIM)
        return cpu_ms(lambda: meta.attend(kv, q, k, v, HEAD_DIM ** -0.5), repeats)
    finally:
        _flash_splits(None)


def flex_dense(contexts: list[int], repeats: int) -> tuple[float, float]:
    """(compile s, ms per call) of flex_attention over a dense [B, Hkv, max, D] KV with a length mask."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    lens = torch.tensor(contexts)
    longest, rows, group = max(contexts), len(contexts), HEADS // KV_HEADS

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx < lens[b]

    t0 = time.perf_counter()
    block_mask = create_block_mask(mask_mod, rows, None, group, longest, device="cpu", BLOCK_SIZE=128)
    compiled = torch.compile(flex_attention, dynamic=False)
    q = torch.randn(rows, KV_HEADS, group, HEAD_DIM)
    k, v = torch.randn(rows, KV_HEADS, longest, HEAD_DIM), torch.randn(rows, KV_HEADS, longest, HEAD_DIM)
    compiled(q, k, v, block_mask=block_mask)
    compile_s = time.perf_counter() - t0
    return compile_s, cpu_ms(lambda: compiled(q, k, v, block_mask=block_mask), repeats)


def decode_step_ms(model, batch: int, context: int, kernel: str, repeats: int, flash: bool | str = False) -> float:
    c = model.config
    per = -(-(context + 2) // BLOCK)
    cache = PagedKVCache(c.num_layers, batch * per, BLOCK, c.num_kv_heads, c.head_dim,
                         dtype=model.embed_tokens.weight.dtype)
    cache.kv.normal_()
    order = torch.randperm(batch * per).tolist()
    runner = ModelRunner(model, cache, decode_kernel=kernel)
    chunks = [SeqChunk(i, [7 + i], context - 1, order[i * per:(i + 1) * per]) for i in range(batch)]
    _flash_splits(flash)
    try:
        return cpu_ms(lambda: runner.run(chunks), repeats)
    finally:
        _flash_splits(None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="Rounds of the whole-step kernels, alternated (section 3).")
    ap.add_argument("--no-flex", action="store_true", help="Skip flex_attention (compiles for ~35 s a shape).")
    ap.add_argument("--doc", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    load0 = os.getloadavg()[0]
    rounds_flag = "" if args.rounds == 3 else f" --rounds {args.rounds}"
    lines = ["# Decode kernels and GEMMs on this CPU (measured)", "",
             f"Written by `python scripts/decode_kernels.py{rounds_flag}`; rerun it rather than editing this file. "
             "One torch "
             f"thread, CPU time, medians of {args.repeats}; torch {torch.__version__}. Machine: {cpu_description()}, "
             f"shared with other sessions (1-minute load average {load0:.2f} at the start", "LOADEND", "",
             "## 1. Projections: F.linear vs oneDNN-packed weights (GFLOP/s)", "",
             "| dtype | rows | weight | F.linear | oneDNN packed | gain |", "|---|---:|---|---:|---:|---:|"]
    gemms = gemm_rates(args.repeats)
    lines += [f"| {d} | {m} | {w} | {a:.0f} | {b:.0f} | {b / a:.2f}x |" for d, m, w, a, b in gemms]
    if torch.bfloat16 not in dtypes():
        lines += ["", "No bf16 rows: this CPU has no oneDNN bf16 path (no AVX512), oneDNN refuses to pack bf16 "
                  "weights, and torch's bf16 matmul falls back to a slow kernel, so the engine's CPU benchmarks serve "
                  "float32 here."]
    peak = PEAKS[torch.float32]
    lines += ["", f"Best fp32 rate measured (the fastest single call of either kind at any shape above, as the read "
              f"bandwidth below is the fastest of its runs): {peak:.0f} GFLOP/s, the roofline's compute peak below. "
              "Measured in this run, on this load: a busier machine measures a lower peak and so a looser bound.", "",
              "## 2. Decode attention, one layer (ms)", "",
              "Bench-200m heads (16 query, 4 KV, dim 64), float32, 32 rows, block size 16, blocks scattered; "
              "`split-kv N`: units of N tokens, merged as the engine merges them (up to "
              f"{attention.SPLIT_MERGE} units while the split's K+V stays within "
              f"{attention.SPLIT_MERGE_BYTES >> 20} MiB); `split-kv in place (C)`: `engine/paged_decode.c`, each row's "
              "blocks read once where they lie, online softmax per block (no gather, no splits).", ""]
    kernels = [("padded", 0, False), ("split-kv", 0, "in place"), ("split-kv", 128, True),
               *(("split-kv", s, False) for s in (64, 128, 256, 512))]
    header = "| contexts | " + " | ".join(_label(k, f) if k == "padded" or f == "in place" else
                                         f"split-kv {s}" + (" flash" if f else " bmm") for k, s, f in kernels)
    lines += [header + (" | flex (dense KV, compiled) |" if not args.no_flex else " |"),
              "|---|" + "---:|" * (len(kernels) + (0 if args.no_flex else 1))]
    for name, contexts in CASES.items():
        cells = [f"{attention_case(sorted(contexts, reverse=True), k, s or 128, args.repeats, f):.2f}"
                 for k, s, f in kernels]
        if not args.no_flex:
            compile_s, ms = flex_dense(contexts, args.repeats)
            cells.append(f"{ms:.2f} (compile {compile_s:.0f} s)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## 3. Decode steps of bench-200m, batch 32 (ms)", "",
              "`split-kv bmm`: head-major gather, batched matmuls; `split-kv flash`: the fused flash kernel on each "
              "split's block-major gather; `split-kv in place (C)`: the C kernel reading the cache in place. Each "
              "step's kernels run alternately, round by round, in this one process; the cell is the median of the "
              "rounds' medians. The engine runs "
              + ", ".join(f"{n} in {str(d).removeprefix('torch.')}" for d, n in
                          ((d, _engine_split(d)) for d in dtypes()))
              + " (`attention.cpu_inplace_decode`, else `attention.cpu_split_bmm`). FLOPs against the best rate of "
              "section 1 in the step's dtype (either column, fastest call). `roofline`: max(bytes / BW, FLOPs / "
              "peak) over the whole step, the classic bound; `per-op "
              "bound`: the same bound taken separately for the projections (weights, their FLOPs) and the attention "
              "(KV, its FLOPs) and summed, also a lower bound for one thread that runs them one after the other, and a "
              "tighter one (the projections are compute-bound, the attention memory-bound).", ""]
    bandwidth = read_bandwidth_bytes_per_s()
    lines += [f"Read bandwidth (tensor.sum over 512 MiB, fastest of 5 in CPU time): {bandwidth / 1e9:.1f} GB/s.", "",
              "| dtype | context | kernel | ms/step | tok/s | min bytes | bytes / BW (ms) | FLOPs / peak (ms) | "
              "roofline / step | per-op bound (ms) | per-op bound / step |",
              "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for dtype in dtypes():
        name = str(dtype).removeprefix("torch.")
        model = random_model(dtype)
        peak_d = PEAKS[dtype]
        for context in (256, 1152):
            nbytes, flops = step_bytes(model, 32, context), step_flops(model, 32, context)
            roof = max(nbytes / bandwidth, flops / (peak_d * 1e9)) * 1e3
            w_bytes, w_flops = step_bytes(model, 32, 0), step_flops(model, 32, 0)  # the projections alone
            per_op = (max(w_bytes / bandwidth, w_flops / (peak_d * 1e9))
                      + max((nbytes - w_bytes) / bandwidth, (flops - w_flops) / (peak_d * 1e9))) * 1e3
            variants = (("split-kv", "in place"), ("split-kv", False), ("split-kv", True), ("padded", False))
            rounds = [[decode_step_ms(model, 32, context, kernel, args.repeats, flash) for kernel, flash in variants]
                      for _ in range(args.rounds)]
            for (kernel, flash), times in zip(variants, zip(*rounds)):
                ms = statistics.median(times)
                label = _label(kernel, flash)
                lines.append(f"| {name} | {context} | {label} | {ms:.1f} | {32e3 / ms:.1f} | {nbytes / 1e9:.3f} GB | "
                             f"{nbytes / bandwidth * 1e3:.0f} | {flops / peak_d / 1e6:.0f} | {roof / ms:.0%} | "
                             f"{per_op:.0f} | {per_op / ms:.0%} |")
        del model
    load1 = os.getloadavg()[0]
    lines[lines.index("LOADEND")] = f"and {load1:.2f} at the end)."
    lines += ["", "## GPU", "", "No GPU was lent to this task: the CUDA path (bf16 when torch sees a GPU; split-kv's "
              "log-sum-exp from plain matmuls there) is tested on CPU only, and there are no GPU measurements here.",
              ""]
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    args.doc.write_text("\n".join(lines))
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
