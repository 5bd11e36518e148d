"""Time attention kernels, GEMMs and an empty step with PyTorch (``servelab profile-gpu``).

On whatever device torch sees (CUDA if present, else the CPU), for one attention layer's
shape, three decode-attention implementations over batches of mixed context lengths:

- ``padded``: one ``scaled_dot_product_attention`` over [rows, heads, longest, head_dim]
  with a key-padding mask (what a padded gather runs: work ~ rows x longest);
- ``per-seq``: one SDPA call per sequence (work per row, rows in sequence);
- ``split-kv``: a ragged kernel in plain tensor ops: every KV token of the packed batch is
  scored against its own row's query, softmax per row by segment max / sum
  (``index_reduce_`` / ``index_add_``), then one weighted sum per row (work ~ sum of contexts,
  the defining property of a split-KV kernel);

plus a causal prefill chunk (SDPA ``is_causal``), GEMMs [T, k] @ [k, n] at T = 1..512, and an
empty step (a host list to the device, one tiny kernel, an argmax read back: the launch and
synchronisation a step pays with no model work). Each timing is the median of ``repeats``
runs after ``warmup`` runs, with the device synchronised around each.

Clock (``clock_for``): wall time on CUDA (the kernels run asynchronously; synchronising
around the call times them), this process's CPU time on a CPU. Why: a CPU kernel of the tiny
preset lasts 10-80 us, and a wall-clock sample also counts any time the process was stalled
(preempted, throttled, waiting for a page) on the shared machine; with 3 repeats the median
cannot drop that when two of them are hit. The padded kernel's fit error came out 0.4%,
5.0%, 3.5%, 51.7% and 100.0% in five wall-clock runs of scripts/costmodel_report.py (one
fit put a 15.8 ms floor under a 15 us kernel; the 100.0% fit predicts what the kernel
costs, so its samples were inflated, not the formula wrong). docs/costmodel.md, section 7,
times both clocks.

Batches: ``uniform`` (every row at the middle context), ``one-long`` (one long row among
short ones: the iteration bubble) and ``two-clusters`` (half short, half long), at several
row counts. The result is the dict ``servelab.costmodel.kernel_profile`` reads.
"""

from __future__ import annotations

import datetime
import statistics
import time
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class ProfileShapes:
    num_heads: int = 32
    num_kv_heads: int = 32
    head_dim: int = 128
    rows: tuple[int, ...] = (8, 32, 128)
    short_context: int = 128
    long_context: int = 4096
    prefill_tokens: int = 1024
    gemms: tuple[tuple[int, int], ...] = ((4096, 12288), (4096, 4096), (4096, 22016), (11008, 4096))
    gemm_tokens: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512)
    repeats: int = 10
    warmup: int = 3

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} must be a multiple of num_kv_heads {self.num_kv_heads}")
        if min(self.rows) < 2 or not 1 <= self.short_context < self.long_context or self.repeats < 1:
            raise ValueError("rows must be >= 2, 1 <= short_context < long_context, repeats >= 1")


# Small enough for a test on a CPU (well under a second of timing).
TINY_SHAPES = ProfileShapes(num_heads=4, num_kv_heads=2, head_dim=16, rows=(4, 8), short_context=8, long_context=64,
                            prefill_tokens=32, gemms=((32, 64),), gemm_tokens=(1, 2, 4, 8, 16, 32), repeats=3,
                            warmup=1)


def batches(shapes: ProfileShapes) -> list[tuple[str, list[int]]]:
    s, long = shapes.short_context, shapes.long_context
    mid = (s + long) // 2
    out = []
    for rows in shapes.rows:
        out.append(("uniform", [mid] * rows))
        out.append(("one-long", [s] * (rows - 1) + [long]))
        out.append(("two-clusters", [s] * (rows // 2) + [long] * (rows - rows // 2)))
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


CLOCKS = ("wall", "cpu")


def clock_for(device: torch.device, clock: str | None = None) -> str:
    """The clock a profile on ``device`` is timed with: ``clock`` if named, else wall on CUDA
    and CPU time on a CPU (module docstring)."""
    if clock is not None and clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
    if clock == "cpu" and device.type == "cuda":
        raise ValueError("a CUDA kernel runs asynchronously on the GPU: time it with the wall clock")
    return clock or ("wall" if device.type == "cuda" else "cpu")


def time_call(fn, device: torch.device, repeats: int, warmup: int, clock: str = "wall") -> float:
    """Median seconds of ``fn`` over ``repeats`` calls after ``warmup``: wall time with the
    device synchronised around each call, or (``clock="cpu"``) this process's CPU time, which
    leaves out the time the scheduler gives other processes."""
    now = time.perf_counter if clock == "wall" else time.process_time
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = now()
        fn()
        _sync(device)
        times.append(now() - t0)
    return statistics.median(times)


def _attention_fns(contexts: list[int], shapes: ProfileShapes, device, dtype, gen):
    h, kh, d = shapes.num_heads, shapes.num_kv_heads, shapes.head_dim
    group, rows, longest, total = h // kh, len(contexts), max(contexts), sum(contexts)
    q = torch.randn(rows, h, d, generator=gen).to(device, dtype)  # q: [B, H, D]
    k_packed = torch.randn(total, kh, d, generator=gen).to(device, dtype)  # k: [S, KH, D]
    v_packed = torch.randn(total, kh, d, generator=gen).to(device, dtype)
    lengths = torch.tensor(contexts, device=device)
    seg = torch.repeat_interleave(torch.arange(rows, device=device), lengths)  # seg: [S] row of each KV token
    starts = [0]
    for c in contexts[:-1]:
        starts.append(starts[-1] + c)
    k_pad = torch.zeros(rows, kh, longest, d, device=device, dtype=dtype)  # [B, KH, L, D]
    v_pad = torch.zeros_like(k_pad)
    for i, (s0, c) in enumerate(zip(starts, contexts)):
        k_pad[i, :, :c] = k_packed[s0:s0 + c].transpose(0, 1)
        v_pad[i, :, :c] = v_packed[s0:s0 + c].transpose(0, 1)
    mask = (torch.arange(longest, device=device)[None, :] < lengths[:, None])[:, None, None, :]  # [B, 1, 1, L]
    k_rep = k_pad.repeat_interleave(group, dim=1)  # [B, H, L, D]
    v_rep = v_pad.repeat_interleave(group, dim=1)
    per_seq_kv = [(k_rep[i:i + 1, :, :c], v_rep[i:i + 1, :, :c]) for i, c in enumerate(contexts)]
    scale = d ** -0.5

    def padded():
        return F.scaled_dot_product_attention(q[:, :, None, :], k_rep, v_rep, attn_mask=mask)

    def per_seq():
        return [F.scaled_dot_product_attention(q[i:i + 1, :, None, :], k, v) for i, (k, v) in enumerate(per_seq_kv)]

    def split_kv():
        qg = q.view(rows, kh, group, d)[seg]  # [S, KH, G, D]: each KV token meets its row's queries
        scores = (qg * k_packed[:, :, None, :]).sum(-1) * scale  # [S, KH, G]
        top = torch.full((rows, kh, group), float("-inf"), device=device, dtype=scores.dtype)
        top = top.index_reduce_(0, seg, scores, "amax", include_self=True)
        p = torch.exp(scores - top[seg])
        denom = torch.zeros_like(top).index_add_(0, seg, p)
        out = torch.zeros(rows, kh, group, d, device=device, dtype=scores.dtype)
        out.index_add_(0, seg, p[..., None] * v_packed[:, :, None, :])
        return out / denom[..., None]

    return {"padded": padded, "per-seq": per_seq, "split-kv": split_kv}


def _empty_step(device):
    token = torch.zeros(1, device=device)

    def step():
        ids = torch.tensor([1, 2, 3], device=device)
        return int((token + ids[:1]).argmax().item())

    return step


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from servelab.engine.calibrate import device_identity

    return device_identity()[0]


def profile_kernels(shapes: ProfileShapes = ProfileShapes(), *, device: str | None = None, dtype: str | None = None,
                    seed: int = 0, progress=None, clock: str | None = None) -> dict:
    """Every timing of the module docstring, as the ``servelab.kernel_profile`` dict (``clock``:
    ``clock_for``'s choice unless named)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    clock = clock_for(dev, clock)
    torch_dtype = getattr(torch, dtype) if dtype else (torch.float16 if dev.type == "cuda" else torch.float32)
    gen = torch.Generator().manual_seed(seed)
    attention = []
    work = batches(shapes)
    for k, (kind, contexts) in enumerate(work):
        with torch.no_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="index_reduce")  # "in beta": the op is what we time
            for kernel, fn in _attention_fns(contexts, shapes, dev, torch_dtype, gen).items():
                attention.append({"kernel": kernel, "batch": kind, "contexts": contexts,
                                  "time_s": time_call(fn, dev, shapes.repeats, shapes.warmup, clock)})
        if progress is not None:
            progress(k + 1, len(work) + len(shapes.gemms) + 1)
    h, t = shapes.num_heads, shapes.prefill_tokens
    q = torch.randn(1, h, t, shapes.head_dim, generator=gen).to(dev, torch_dtype)
    with torch.no_grad():
        prefill_s = time_call(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True), dev, shapes.repeats,
                              shapes.warmup, clock)
    gemms = []
    for k_dim, n_dim in shapes.gemms:
        w = torch.randn(n_dim, k_dim, generator=gen).to(dev, torch_dtype)
        times = []
        for tokens in shapes.gemm_tokens:
            x = torch.randn(tokens, k_dim, generator=gen).to(dev, torch_dtype)
            with torch.no_grad():
                times.append(time_call(lambda: F.linear(x, w), dev, shapes.repeats, shapes.warmup, clock))
        gemms.append({"k": k_dim, "n": n_dim, "tokens": list(shapes.gemm_tokens), "time_s": times})
        if progress is not None:
            progress(len(work) + len(gemms), len(work) + len(shapes.gemms) + 1)
    empty = time_call(_empty_step(dev), dev, shapes.repeats, shapes.warmup, clock)
    from servelab.costmodel.kernel_profile import SCHEMA, VERSION

    return {"schema": SCHEMA, "version": VERSION, "device": device_name(dev), "device_kind": dev.type,
            "dtype": str(torch_dtype).removeprefix("torch."), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "clock": clock,
            "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "shape": {"num_heads": shapes.num_heads, "num_kv_heads": shapes.num_kv_heads, "head_dim": shapes.head_dim},
            "attention": attention, "prefill": {"tokens": t, "time_s": prefill_s}, "gemms": gemms,
            "empty_step_s": empty}
