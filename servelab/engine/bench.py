"""Decode-step microbenchmark: time per step vs the bytes a step must read.

``servelab perf engine-steps --batch 1,8,32 --context 256`` builds a random-weight model
(``tiny_model.BENCH_200M`` unless ``--checkpoint`` is given), fills a paged cache with random
K/V (a decode step's cost does not depend on the values, and skipping prefill keeps the run
short on CPU), and times ragged decode steps through ``ModelRunner``. Per step it reports the
minimum bytes read (every weight once, except embedding rows; K/V of every context token
once), the bandwidth that implies, and the FLOPs rate; ``--stream`` also measures a plain
tensor-sum read bandwidth on this machine as the roofline reference.
"""

from __future__ import annotations

import statistics
import time

import torch

from servelab.engine.config import ModelConfig
from servelab.engine.kv_cache import PagedKVCache, bytes_per_block
from servelab.engine.loader import DTYPES, build_model, hf_to_model_state, load_checkpoint
from servelab.engine.model import Model
from servelab.engine.runner import ModelRunner, SeqChunk
from servelab.engine.tiny_model import BENCH_200M, random_hf_weights


def random_model(dtype: torch.dtype, **overrides) -> Model:
    kwargs = {**BENCH_200M, **overrides}
    config = ModelConfig(head_dim=kwargs["hidden_size"] // kwargs["num_heads"], **kwargs)
    state = hf_to_model_state(random_hf_weights(config, seed=0), config)
    return build_model(config, state, dtype=dtype)


def step_bytes(model: Model, batch: int, context: int) -> int:
    c = model.config
    itemsize = model.embed_tokens.weight.element_size()
    weights = sum(p.numel() for p in model.parameters()) * itemsize
    if not c.tie_embeddings:
        weights -= model.embed_tokens.weight.numel() * itemsize  # only `batch` rows are read
    kv_per_token = bytes_per_block(c.num_layers, 1, c.num_kv_heads, c.head_dim, model.embed_tokens.weight.dtype)
    return weights + batch * context * kv_per_token


def step_flops(model: Model, batch: int, context: int) -> float:
    c = model.config
    linear = sum(p.numel() for n, p in model.named_parameters() if n.endswith("weight") and p.dim() == 2)
    if not c.tie_embeddings:
        linear -= model.embed_tokens.weight.numel()
    attention = 4 * c.num_layers * c.num_heads * c.head_dim * context  # QK^T and PV per query token
    return 2.0 * batch * linear + batch * attention


def time_decode(model: Model, batch: int, context: int, *, block_size: int = 16, steps: int = 5) -> float:
    """Median seconds of one decode step for ``batch`` sequences at ``context`` tokens."""
    c = model.config
    blocks_per_seq = -(-(context + steps + 1) // block_size)
    cache = PagedKVCache(c.num_layers, batch * blocks_per_seq, block_size, c.num_kv_heads, c.head_dim,
                         dtype=model.embed_tokens.weight.dtype)
    cache.kv.normal_()
    runner = ModelRunner(model, cache)
    order = torch.randperm(batch * blocks_per_seq).tolist()  # scattered blocks, as after churn
    tables = [order[i * blocks_per_seq:(i + 1) * blocks_per_seq] for i in range(batch)]
    times = []
    for step in range(steps + 1):
        pos = context - 1 + step
        chunks = [SeqChunk(i, [7 + i], pos, tables[i]) for i in range(batch)]
        t0 = time.perf_counter()
        runner.run(chunks)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def cpu_ms_samples(fn, repeats: int) -> list[float]:
    """CPU milliseconds of each of ``repeats`` calls of ``fn()`` after one warm-up call. CPU
    time, not wall time: on a machine shared with other sessions wall time mostly measures them."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append((time.process_time() - t0) * 1e3)
    return times


def median_cpu_ms(fn, repeats: int) -> float:
    """Median of ``cpu_ms_samples``: a typical call."""
    return statistics.median(cpu_ms_samples(fn, repeats))


def read_bandwidth_bytes_per_s(num_bytes: int = 1 << 29, repeats: int = 5) -> float:
    """Single-thread read bandwidth: ``tensor.sum`` over ``num_bytes``, the fastest of ``repeats``
    in CPU time. CPU time, as the steps it bounds are timed: wall time on a shared machine also
    counts the time other processes held the core, which would understate the bandwidth and so
    loosen every roofline drawn from it. The fastest run, because a roofline is a bound."""
    x = torch.ones(num_bytes // 4)
    x.sum()
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        x.sum()
        times.append(time.process_time() - t0)
    return num_bytes / max(min(times), 1e-9)


def run(args) -> None:
    """The benchmark; ``args`` carries the ``servelab perf engine-steps`` options."""
    torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    model = load_checkpoint(args.checkpoint, dtype=dtype).model if args.checkpoint else random_model(dtype)
    num_params = sum(p.numel() for p in model.parameters())
    print(f"model: {num_params / 1e6:.0f}M params, {args.dtype}, threads={args.threads}, context={args.context}")
    if args.stream:
        print(f"plain read bandwidth (tensor.sum): {read_bandwidth_bytes_per_s() / 1e9:.1f} GB/s")
    for batch in args.batch:
        step_s = time_decode(model, batch, args.context, steps=args.steps)
        nbytes, flops = step_bytes(model, batch, args.context), step_flops(model, batch, args.context)
        print(f"batch {batch:3d}: {step_s * 1e3:8.1f} ms/step  {batch / step_s:7.1f} tok/s  "
              f"min bytes {nbytes / 1e9:.3f} GB -> {nbytes / step_s / 1e9:5.1f} GB/s  "
              f"{flops / step_s / 1e9:6.1f} GFLOP/s")

