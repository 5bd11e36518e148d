"""Decode kernels and GEMMs of the engine on this CPU; writes docs/benchmarks/decode_kernels.md.

    python scripts/decode_kernels.py [--repeats 5] [--rounds 3] [--no-flex]

1. Projections: ``F.linear``, oneDNN-packed weights and the C decode GEMM (``decode_gemm``:
   the engine's projections up to 512 rows on an AVX2 CPU in float32) at the bench-200m shapes,
   fp32 and bf16, 32 and 2,048 rows.
2. Decode attention of one layer (bench-200m heads, block size 16, scattered blocks): the
   padded kernel, the split-kv kernel at several split sizes, and ``flex_attention`` compiled
   over a dense (unpaged) KV as the bound a compiled kernel could reach; uniform, one long row
   among short ones, and spread contexts.
3. Whole decode steps of bench-200m (batch 32 at context 256 and 1,152) per kernel, the kernels
   alternated round by round in one process, against this
   CPU's roofline: max(bytes a step must read / measured read bandwidth, FLOPs / the best
   measured single-core GEMM rate); the engine's kernel also with oneDNN-packed projections
   instead of the decode GEMM, and with its KV cache on 4 KiB pages instead of huge pages,
   alternated with it.
4. Where the engine's step at batch 32, context 1,152 spends its CPU time, part by part
   (``step_breakdown``: module hooks, CPU time).
All timings are CPU time of one thread, medians.
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

from servelab.engine import attention, decode_gemm, hugepages, step_breakdown  # noqa: E402
from servelab.engine.attention import GatherWorkspace  # noqa: E402
from servelab.engine.device import cpu_description, cpu_has_bf16  # noqa: E402
from servelab.engine.bench import (  # noqa: E402
    cpu_ms_samples, median_cpu_ms as cpu_ms, random_model, read_bandwidth_bytes_per_s, step_bytes, step_flops)
from servelab.engine.kv_cache import PagedKVCache  # noqa: E402
from servelab.engine import model as model_mod  # noqa: E402
from servelab.engine.model import Linear  # noqa: E402
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


def gemm_rates(repeats: int) -> list[tuple[str, int, str, float, float, float | None]]:
    """(dtype, rows, weight, F.linear, oneDNN packed, decode GEMM or None) GFLOP/s medians, and the
    fastest rate seen per dtype (the roofline's peak) in ``PEAKS``."""
    rows = []
    for dtype in dtypes():
        for n, k, name in ((1536, 1024, "qkv"), (1024, 1024, "o"), (5632, 1024, "gate_up"), (1024, 2816, "down")):
            w = torch.randn(n, k, dtype=dtype)
            packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
            panels = decode_gemm.pack(w) if decode_gemm.can_pack(w) else None
            for m in (32, 2048):
                x = torch.randn(m, k, dtype=dtype)
                flops = 2 * m * n * k
                calls = [lambda: F.linear(x, w),
                         lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")]
                if panels is not None:
                    calls.append(lambda: decode_gemm.linear(x, panels, None))
                rates = [flops / cpu_ms(fn, repeats) / 1e6 for fn in calls]
                best = flops / min(fastest_ms(fn, repeats) for fn in calls) / 1e6
                PEAKS[dtype] = max(PEAKS.get(dtype, 0.0), *rates, best)
                rows.append((str(dtype).removeprefix("torch."), m, f"{name} [{n} x {k}]", rates[0], rates[1],
                             rates[2] if panels is not None else None))
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


def use_projections(model, kind: str) -> None:
    """Point every projection at the decode GEMM's panels ("decode GEMM") or at a oneDNN-packed
    copy ("oneDNN"), both kept on the layer between calls (``_bench_panels``, ``_bench_onednn``)."""
    for m in model.modules():
        if isinstance(m, Linear):
            if not hasattr(m, "_bench_panels"):
                m._bench_panels = m.panels
                m._bench_onednn = (torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), None)
                                   if m.panels is not None else m.packed)
            m.panels = m._bench_panels if kind == "decode GEMM" else None
            m.packed = m._bench_onednn if kind == "oneDNN" or m.panels is None else None


def engine_projections(model) -> str:
    return "decode GEMM" if any(isinstance(m, Linear) and m.panels is not None for m in model.modules()) else "oneDNN"


def step_runner(model, batch: int, context: int, kernel: str = "split-kv", huge_pages: bool = True):
    """A runner over a cache of random K/V with scattered blocks, and the step's chunks."""
    c = model.config
    per = -(-(context + 2) // BLOCK)
    cache = PagedKVCache(c.num_layers, batch * per, BLOCK, c.num_kv_heads, c.head_dim,
                         dtype=model.embed_tokens.weight.dtype, huge_pages=huge_pages)
    cache.kv.normal_()
    order = torch.randperm(batch * per).tolist()
    runner = ModelRunner(model, cache, decode_kernel=kernel)
    return runner, [SeqChunk(i, [7 + i], context - 1, order[i * per:(i + 1) * per]) for i in range(batch)]


def decode_step_ms(model, batch: int, context: int, kernel: str, repeats: int, flash: bool | str = False,
                   projections: str | None = None, huge_pages: bool = True) -> float:
    runner, chunks = step_runner(model, batch, context, kernel, huge_pages)
    engine = engine_projections(model)
    use_projections(model, projections or engine)
    _flash_splits(flash)
    try:
        return cpu_ms(lambda: runner.run(chunks), repeats)
    finally:
        _flash_splits(None)
        use_projections(model, engine)


def step_breakdown_lines(model, repeats: int, plain_ms: float) -> list[str]:
    """Section 4: the engine's float32 step at batch 32, context 1,152, part by part."""
    runner, chunks = step_runner(model, 32, 1152)
    parts = step_breakdown.breakdown(model, lambda: runner.run(chunks), repeats)
    return ["", "## 4. Where the engine's step goes: float32, batch 32, context 1,152 (CPU ms)", "",
            "`engine/step_breakdown.py`: each projection, norm, attention module, MLP, decoder layer, the model and "
            "the runner's step timed by module hooks in CPU time, medians of "
            f"{repeats} steps; a part that is no module is its parent's time less its timed children. The hooks' own "
            "cost lands in those remainders; the plain step beside the total is the engine's row of section 3.", "",
            "| part | ms / step | ms / layer | share |", "|---|---:|---:|---:|",
            *step_breakdown.format_rows(parts, plain_ms, model.config.num_layers)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="Rounds of the whole-step kernels, alternated (section 3).")
    ap.add_argument("--no-flex", action="store_true", help="Skip flex_attention (compiles for ~35 s a shape).")
    ap.add_argument("--doc", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    load0 = os.getloadavg()[0]
    rounds_flag = ("" if args.repeats == 5 else f" --repeats {args.repeats}") + (
        "" if args.rounds == 3 else f" --rounds {args.rounds}") + (" --no-flex" if args.no_flex else "")
    lines = ["# Decode kernels and GEMMs on this CPU (measured)", "",
             f"Written by `python scripts/decode_kernels.py{rounds_flag}`; rerun it rather than editing this file. "
             "One torch "
             f"thread, CPU time, medians of {args.repeats}; torch {torch.__version__}. Machine: {cpu_description()}, "
             f"shared with other sessions (1-minute load average {load0:.2f} at the start", "LOADEND", "",
             "## 1. Projections: F.linear, oneDNN-packed weights and the decode GEMM (GFLOP/s)", "",
             "`decode GEMM (C)`: `engine/decode_gemm.c`, the weight packed once into 16-column panels (in chunks of "
             f"{decode_gemm.CHUNK} k's, on huge pages where `engine/hugepages.py` can), 6 x 16 register tiles, x "
             "copied per call into the row groups' order, the weight's next block asked for by every row group; the "
             "engine multiplies with it up to "
             f"{model_mod.PACKED_MAX_ROWS} rows where it runs (float32, AVX2, one torch thread: "
             f"{'here' if decode_gemm.kernel() is not None else 'not here: ' + str(decode_gemm.LIBRARY.why_not)}), with "
             "oneDNN's packed weights where it does not, and with F.linear above that.", "",
             "| dtype | rows | weight | F.linear | oneDNN packed | decode GEMM (C) | best / F.linear |",
             "|---|---:|---|---:|---:|---:|---:|"]
    gemms = gemm_rates(args.repeats)
    lines += [f"| {d} | {m} | {w} | {a:.0f} | {b:.0f} | {'-' if c is None else f'{c:.0f}'} | "
              f"{max(a, b, c or 0) / a:.2f}x |" for d, m, w, a, b, c in gemms]
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
              + " (`attention.cpu_inplace_decode`, else `attention.cpu_split_bmm`), its projections with the "
              "decode GEMM where it runs, its KV cache on transparent huge pages ("
              + (f"not here: {hugepages.why_not()}" if hugepages.why_not() else "here: `engine/hugepages.py`")
              + "); `oneDNN projections`: the engine's step with oneDNN-packed weights instead "
              "(the engine before issue 27), alternated with it; `KV on 4 KiB pages`: the engine's step with its cache "
              "on small pages, alternated with it. FLOPs against the best rate of "
              "section 1 in the step's dtype (any column, fastest call). `roofline`: max(bytes / BW, FLOPs / "
              "peak) over the whole step, the classic bound; `per-op "
              "bound`: the same bound taken separately for the projections (weights, their FLOPs) and the attention "
              "(KV, its FLOPs) and summed, also a lower bound for one thread that runs them one after the other, and a "
              "tighter one (the projections are compute-bound, the attention memory-bound).", ""]
    bandwidth = read_bandwidth_bytes_per_s()
    lines += [f"Read bandwidth (tensor.sum over 512 MiB, fastest of 5 in CPU time): {bandwidth / 1e9:.1f} GB/s.", "",
              "| dtype | context | kernel | ms/step | tok/s | min bytes | bytes / BW (ms) | FLOPs / peak (ms) | "
              "roofline / step | per-op bound (ms) | per-op bound / step |",
              "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    breakdown: list[str] = []
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
            engine = engine_projections(model)
            variants = [("split-kv", "in place", engine, True), ("split-kv", False, engine, True),
                        ("split-kv", True, engine, True), ("padded", False, engine, True)]
            if hugepages.why_not() is None:  # the engine's step with its cache on 4 KiB pages, alternated with it
                variants.insert(1, ("split-kv", "in place", engine, False))
            if engine == "decode GEMM":  # the engine's step with its earlier projections, alternated with it
                variants.insert(1, ("split-kv", "in place", "oneDNN", True))
            rounds = [[decode_step_ms(model, 32, context, kernel, args.repeats, flash, proj, huge)
                       for kernel, flash, proj, huge in variants] for _ in range(args.rounds)]
            for (kernel, flash, proj, huge), times in zip(variants, zip(*rounds)):
                ms = statistics.median(times)
                label = _label(kernel, flash) + ("" if proj == engine else f", {proj} projections") + (
                    "" if huge else ", KV on 4 KiB pages")
                if proj == engine and huge and (kernel, flash) == ("split-kv", "in place"):
                    label = f"**{label}** (the engine)"
                lines.append(f"| {name} | {context} | {label} | {ms:.1f} | {32e3 / ms:.1f} | {nbytes / 1e9:.3f} GB | "
                             f"{nbytes / bandwidth * 1e3:.0f} | {flops / peak_d / 1e6:.0f} | {roof / ms:.0%} | "
                             f"{per_op:.0f} | {per_op / ms:.0%} |")
            if context == 1152 and dtype == torch.float32:
                breakdown = step_breakdown_lines(model, args.repeats, statistics.median(r[0] for r in rounds))
        del model
    lines += breakdown
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
