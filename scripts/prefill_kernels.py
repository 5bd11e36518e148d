"""Prefill attention kernels of the engine on this CPU; writes docs/benchmarks/prefill_kernels.md.

    python scripts/prefill_kernels.py [--repeats 5] [--step-repeats 3] [--no-flex]

1. One layer's attention for one prefill chunk (bench-200m heads: 16 query, 4 KV, dim 64) of
   ``n`` new tokens after ``start`` cached ones, bf16 and float32, one thread: the engine's
   previous kernel (SDPA is_causal from position 0, else the fused flash kernel with an additive
   mask), SDPA with ``causal_lower_right`` and with ``enable_gqa``, the fused kernel split into
   the cached prefix and the chunk's causal block merged by log-sum-exp (``flash``), query tiles
   of batched matmuls (``matmul-tiles``) at three tile sizes, and ``flex_attention`` compiled.
   Which SDPA path each call takes is printed from torch's own dispatch (the fused CPU flash
   kernel or the math fallback). Every kernel's largest error against float32 attention over
   the same inputs is reported beside its time.
2. Whole prefill steps of bench-200m (random weights) with the previous kernel and with the
   engine's kernel for the dtype, and the attention's share of the step.
CPU time of one thread, medians.
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
OUT = ROOT / "docs" / "benchmarks" / "prefill_kernels.md"

from servelab.engine import attention, prefill_kernels  # noqa: E402
from servelab.engine.bench import median_cpu_ms as cpu_ms, random_model  # noqa: E402
from servelab.engine.kv_cache import PagedKVCache  # noqa: E402
from servelab.engine.prefill_kernels import flash_causal_attention, tiled_causal_attention  # noqa: E402
from servelab.engine.runner import ModelRunner, SeqChunk  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 16, 4, 64, 32
GROUP = HEADS // KV_HEADS
SHAPES = [(256, 0), (1024, 0), (2048, 0), (128, 1000), (512, 1536), (1024, 1024)]
FLASH_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def _future(n: int, start: int) -> torch.Tensor:
    return torch.arange(start + n).unsqueeze(0) > (start + torch.arange(n)).unsqueeze(1)  # [n, ctx]


def previous(q, k, v, start, scale):
    """The engine's kernel before this change (q: [n, Hq, D]; k, v: [Hkv, ctx, D])."""
    q4 = q.transpose(0, 1).unsqueeze(0)
    k4, v4 = k.repeat_interleave(GROUP, 0).unsqueeze(0), v.repeat_interleave(GROUP, 0).unsqueeze(0)
    if start == 0:
        return F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, scale=scale)[0].transpose(0, 1)
    future = _future(q.shape[0], start)
    bias = torch.zeros(future.shape, dtype=q.dtype).masked_fill_(future, float("-inf"))
    return FLASH_CPU(q4, k4, v4, attn_mask=bias, scale=scale)[0][0].transpose(0, 1)


def lower_right(q, k, v, start, scale):
    from torch.nn.attention.bias import causal_lower_right

    q4 = q.transpose(0, 1).unsqueeze(0)
    k4, v4 = k.repeat_interleave(GROUP, 0).unsqueeze(0), v.repeat_interleave(GROUP, 0).unsqueeze(0)
    mask = causal_lower_right(q.shape[0], k.shape[1])
    return F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, scale=scale)[0].transpose(0, 1)


def gqa(q, k, v, start, scale):
    q4 = q.transpose(0, 1).unsqueeze(0)
    if start:
        mask = ~_future(q.shape[0], start)
        out = F.scaled_dot_product_attention(q4, k.unsqueeze(0), v.unsqueeze(0), attn_mask=mask, scale=scale,
                                             enable_gqa=True)
    else:
        out = F.scaled_dot_product_attention(q4, k.unsqueeze(0), v.unsqueeze(0), is_causal=True, scale=scale,
                                             enable_gqa=True)
    return out[0].transpose(0, 1)


def reference(q, k, v, start, scale):
    kk, vv = k.float().repeat_interleave(GROUP, 0), v.float().repeat_interleave(GROUP, 0)
    scores = q.float().transpose(0, 1) @ kk.transpose(1, 2) * scale
    return (torch.softmax(scores.masked_fill(_future(q.shape[0], start), float("-inf")), -1) @ vv).transpose(0, 1)


def sdpa_backend(dtype: torch.dtype, n: int, start: int, kind: str) -> str:
    """torch's own choice for the SDPA call of ``kind`` (``torch._fused_sdp_choice``)."""
    q = torch.zeros(1, HEADS, n, HEAD_DIM, dtype=dtype)
    kv = torch.zeros(1, HEADS if kind != "gqa" else KV_HEADS, n + start, HEAD_DIM, dtype=dtype)
    if kind == "previous" and start:
        return "flash (called directly, float mask)"
    kwargs = {"is_causal": True} if start == 0 else {"attn_mask": ~_future(n, start)}
    if kind == "gqa":
        kwargs["enable_gqa"] = True
    choice = torch._fused_sdp_choice(q, kv, kv, **kwargs)
    names = {int(b): name for name, b in torch.nn.attention.SDPBackend.__members__.items()}
    return names.get(int(choice), str(choice)).lower()


def flex_kernel(n: int, start: int, dtype: torch.dtype):
    """(compile s, fn) of flex_attention compiled for this shape, bottom-right causal, GQA."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + start

    torch._dynamo.reset()  # each shape compiles afresh (in one process, later shapes otherwise ran 10-40x slower)
    t0 = time.perf_counter()
    block_mask = create_block_mask(mask_mod, None, None, n, n + start, device="cpu", BLOCK_SIZE=128)
    compiled = torch.compile(flex_attention, dynamic=False)

    def run(q, k, v, start_, scale):
        out = compiled(q.transpose(0, 1).unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), block_mask=block_mask,
                       scale=scale, enable_gqa=True)
        return out[0].transpose(0, 1)
    return t0, run


def kernel_table(args) -> list[str]:
    kernels = {"previous": previous, "SDPA causal_lower_right": lower_right, "SDPA enable_gqa": gqa,
               "flash (split + lse)": flash_causal_attention,
               **{f"matmul-tiles {t}": (lambda t: lambda *a: tiled_causal_attention(*a, tile=t))(t)
                  for t in (64, 128, 256)}}
    names = list(kernels) + ([] if args.no_flex else ["flex (compiled)"])
    lines = ["| dtype | n / start | SDPA path (previous / lower_right / gqa) | "
             + " | ".join(names) + " |", "|---|---|---|" + "---:|" * len(names)]
    speedups: dict[str, dict[str, list[float]]] = {}
    for dtype in (torch.bfloat16, torch.float32):
        dname = str(dtype).removeprefix("torch.")
        for n, start in SHAPES:
            gen = torch.Generator().manual_seed(n + start)
            q = torch.randn(n, HEADS, HEAD_DIM, generator=gen).to(dtype)
            k = torch.randn(KV_HEADS, n + start, HEAD_DIM, generator=gen).to(dtype)
            v = torch.randn(KV_HEADS, n + start, HEAD_DIM, generator=gen).to(dtype)
            scale = HEAD_DIM ** -0.5
            ref = reference(q, k, v, start, scale)
            flops = 4 * HEADS * HEAD_DIM * (n * start + n * (n + 1) / 2)  # the causal half only
            fns = dict(kernels)
            compile_s = None
            if not args.no_flex:
                t0, fns["flex (compiled)"] = flex_kernel(n, start, dtype)
                fns["flex (compiled)"](q, k, v, start, scale)
                compile_s = time.perf_counter() - t0
            cells, times = [], {}
            for name, fn in fns.items():
                err = (fn(q, k, v, start, scale).float() - ref).abs().max().item()
                ms = times[name] = cpu_ms(lambda: fn(q, k, v, start, scale), args.repeats)
                extra = f", compile {compile_s:.0f} s" if name.startswith("flex") else ""
                cells.append(f"{ms:.1f} ({flops / ms / 1e6:.0f}; {err:.0e}{extra})")
            paths = " / ".join(sdpa_backend(dtype, n, start, kind) for kind in ("previous", "lower_right", "gqa"))
            lines.append(f"| {str(dtype).removeprefix('torch.')} | {n} / {start} | {paths} | " + " | ".join(cells)
                         + " |")
            print(lines[-1], flush=True)
            for name, ms in times.items():
                speedups.setdefault(dname, {}).setdefault(name, []).append(times["previous"] / ms)
    lines += ["", "Speed-up over `previous`, geometric mean over the shapes (min-max); the engine's kernel per dtype "
              "(`prefill_kernels.CPU_PREFILL_KERNELS`) is marked:", ""]
    for dname, per in speedups.items():
        engine = prefill_kernels.cpu_prefill_kernel(getattr(torch, dname))
        tile = prefill_kernels.PREFILL_TILES.get(getattr(torch, dname), 64)
        label = {"matmul-tiles": f"matmul-tiles {tile}", "flash": "flash (split + lse)"}[engine]
        cells = [f"{name}{' (engine)' if name == label else ''} {statistics.geometric_mean(x):.2f}x "
                 f"({min(x):.2f}-{max(x):.2f})" for name, x in per.items() if name != "previous"]
        lines.append(f"- {dname}: " + "; ".join(cells) + ".")
    return lines


def _previous_prefill(kv_layer, q, k, v, chunk, scale, workspace):
    rows = slice(chunk.query_start, chunk.query_start + chunk.query_len)
    if chunk.bias is None:
        k_c, v_c = k[rows].transpose(0, 1), v[rows].transpose(0, 1)
    else:
        k_c, v_c = attention.gather_kv(kv_layer, chunk.block_table.unsqueeze(0), workspace)
        k_c, v_c = k_c[0, :, :chunk.context_len], v_c[0, :, :chunk.context_len]
    return previous(q[rows], k_c, v_c, chunk.context_len - chunk.query_len, scale)


def step_table(args) -> list[str]:
    steps = {"8 x 256 from 0": [(256, 0)] * 8, "2 x 1,024 from 0": [(1024, 0)] * 2,
             "1,024 after 1,024 cached": [(1024, 1024)], "2,048 from 0": [(2048, 0)]}
    lines = ["| dtype | step (chunks) | previous (ms) | engine kernel | engine (ms) | previous / engine | "
             "attention share, previous -> engine |", "|---|---|---:|---|---:|---:|---|"]
    engine_prefill = attention._prefill_attention
    for dtype in (torch.bfloat16, torch.float32):
        model = random_model(dtype)
        c = model.config
        for label, chunks in steps.items():
            per = [-(-(n + s) // BLOCK) for n, s in chunks]
            cache = PagedKVCache(c.num_layers, sum(per) + 1, BLOCK, c.num_kv_heads, c.head_dim, dtype=dtype)
            cache.kv.normal_()
            order = torch.randperm(sum(per)).tolist()
            seqs, used = [], 0
            for i, ((n, s), p) in enumerate(zip(chunks, per)):
                seqs.append(SeqChunk(i, [(7 * i + j) % 1000 for j in range(n)], s, order[used:used + p]))
                used += p
            runner = ModelRunner(model, cache)
            times, attn = {}, {}
            for name, impl in (("previous", _previous_prefill), ("engine", engine_prefill)):
                attention._prefill_attention = impl
                try:
                    times[name] = cpu_ms(lambda: runner.run(seqs), args.step_repeats)
                finally:
                    attention._prefill_attention = engine_prefill
                attn[name] = _attention_ms(impl, chunks, dtype, c.num_layers, args.step_repeats)
            kernel = prefill_kernels.cpu_prefill_kernel(dtype)
            lines.append(f"| {str(dtype).removeprefix('torch.')} | {label} | {times['previous']:.0f} | {kernel} | "
                         f"{times['engine']:.0f} | {times['previous'] / times['engine']:.2f}x | "
                         f"{attn['previous'] / times['previous']:.0%} -> {attn['engine'] / times['engine']:.0%} |")
            print(lines[-1], flush=True)
        del model
    return lines


def _attention_ms(impl, chunks, dtype, layers: int, repeats: int) -> float:
    """The attention of a step's chunks over ``layers`` layers, timed alone (fresh K/V, as from position 0,
    or the prefix from a dense tensor: the gather is a few percent of it)."""
    total = 0.0
    for n, start in chunks:
        gen = torch.Generator().manual_seed(n)
        q = torch.randn(n, HEADS, HEAD_DIM, generator=gen).to(dtype)
        k = torch.randn(KV_HEADS, n + start, HEAD_DIM, generator=gen).to(dtype)
        v = torch.randn(KV_HEADS, n + start, HEAD_DIM, generator=gen).to(dtype)
        fn = previous if impl is _previous_prefill else (
            tiled_causal_attention if prefill_kernels.cpu_prefill_kernel(dtype) == "matmul-tiles"
            else flash_causal_attention)
        total += cpu_ms(lambda: fn(q, k, v, start, HEAD_DIM ** -0.5), repeats)
    return total * layers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--step-repeats", type=int, default=3)
    ap.add_argument("--no-flex", action="store_true", help="Skip flex_attention (compiles per shape).")
    ap.add_argument("--no-steps", action="store_true", help="Skip section 2 (whole steps).")
    ap.add_argument("--doc", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    load0, nice = os.getloadavg()[0], os.nice(0)
    lines = ["# Prefill attention kernels on this CPU (measured)", "",
             "Written by `python scripts/prefill_kernels.py`; rerun it rather than editing this file. One torch "
             f"thread, CPU time, medians of {args.repeats} (steps: {args.step_repeats}); torch {torch.__version__}; "
             f"process nice {nice}. Machine: 2 cores shared with other sessions (1-minute load average "
             f"{load0:.2f} at the start", "LOADEND", "",
             "## 1. One layer, one chunk: ms (attention GFLOP/s over the causal half; largest error vs float32 "
             "attention)", "",
             f"Bench-200m heads ({HEADS} query, {KV_HEADS} KV, dim {HEAD_DIM}); `n / start`: new tokens / cached "
             "tokens before them. `previous` is the engine's kernel before this change. The SDPA path column is "
             "torch's dispatch choice (`torch._fused_sdp_choice`) for the previous call, causal_lower_right "
             "(materialised to a boolean mask on CPU) and enable_gqa. flex: `compile` is the seconds to its first "
             "result, with torch's on-disk compile caches warm from earlier runs of this script.", ""]
    lines += kernel_table(args)
    if not args.no_steps:
        lines += ["", "## 2. Whole prefill steps of bench-200m (ms of CPU per step)", "",
                  "Random weights, block size 32, scattered blocks; the attention share is the chunks' attention "
                  "timed alone (16 layers) over the step's time.", ""]
        lines += step_table(args)
    load1 = os.getloadavg()[0]
    lines[lines.index("LOADEND")] = f"and {load1:.2f} at the end)."
    lines += ["", "## GPU", "", "No GPU was lent to this task: on CUDA a chunk still runs SDPA (is_causal from "
              "position 0, its additive mask after a cached prefix); nothing here is a GPU measurement.", ""]
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    args.doc.write_text("\n".join(lines))
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
