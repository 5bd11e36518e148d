"""The iteration bubble on the real engine, and the calibrated model's term for it, per kernel.

With the ``padded`` decode kernel the engine attends a decode batch over one tensor padded to
the longest context, so a batch with one long context among short ones costs more than a batch
with the same context sum spread evenly. The cost model's ``decode rows x longest context``
term exists for exactly this; the test measures both steps (medians, interleaved, so machine
noise hits both alike) and checks that the engine pays the bubble and that a model calibrated
with the skewed points predicts the skewed step better than one fitted from the context sum
alone. With the ``split-kv`` kernel (the default) each row reads only its own blocks: the
bubble is gone, and the term calibrated on it is a fraction of the padded kernel's.
Numbers: docs/benchmarks/cluster_layer.md (scripts/cluster_layer_report.py).
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from servelab.costmodel.fitting import nonneg_relative_lstsq
from servelab.costmodel.linear import COEFFICIENTS, step_features
from servelab.engine.calibrate import CalibrationGrid, _Point, calibrate
from servelab.engine.kv_cache import PagedKVCache
from servelab.engine.loader import load_checkpoint
from servelab.engine.runner import ModelRunner, SeqChunk

MODEL = dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256, max_position=4096)
ROWS, SHORT, LONG = 16, 32, 2048
EVEN = (15 * SHORT + LONG) // ROWS  # the same context sum, spread evenly


def _chunks(contexts, block_size):
    chunks, used = [], 0
    for rid, ctx in enumerate(contexts):
        width = -(-(ctx + 1) // block_size)
        chunks.append(SeqChunk(rid, [3], ctx - 1, list(range(used, used + width))))
        used += width
    return chunks


GRID = CalibrationGrid(prefill_tokens=(16, 64), prefill_cached=(0,), decode_rows=(1, 8, 16),
                       decode_context=(64, 512), decode_skewed=((8, 32, 1024), (16, 64, 1536)),
                       mixed_decodes=(4,), padded_decode=(), padded_prefill=(), repeats=3, swap_blocks=0)


def _skewed_and_even_s(loaded, kernel):
    c = loaded.config
    cache = PagedKVCache(c.num_layers, ROWS * (LONG // 16 + 2), 16, c.num_kv_heads, c.head_dim)
    runner = ModelRunner(loaded.model, cache, decode_kernel=kernel)
    skewed = _chunks([SHORT] * (ROWS - 1) + [LONG], 16)
    even = _chunks([EVEN] * ROWS, 16)
    times = {"skewed": [], "even": []}
    for _ in range(7):
        for name, chunks in (("skewed", skewed), ("even", even)):
            t0 = time.process_time()  # CPU time: other processes on a shared machine do not count
            runner.run(chunks)
            times[name].append(time.process_time() - t0)
    return tuple(statistics.median(times[k][1:]) for k in ("skewed", "even"))


def test_split_kv_removes_the_bubble_and_its_term(make_checkpoint):
    torch.set_num_threads(1)
    loaded = load_checkpoint(make_checkpoint(**MODEL))
    split_skewed, split_even = _skewed_and_even_s(loaded, "split-kv")
    padded_skewed, padded_even = _skewed_and_even_s(loaded, "padded")
    # interleaving is per kernel, so compare ratios: the padded kernel's skew penalty is the bubble
    assert split_skewed / split_even < 0.75 * (padded_skewed / padded_even)
    split_model, _, _ = calibrate(loaded, GRID, decode_kernel="split-kv", clock=time.process_time)
    padded_model, _, _ = calibrate(loaded, GRID, decode_kernel="padded", clock=time.process_time)
    assert split_model.meta["attention_kernel"] == "split-kv"
    assert padded_model.meta["attention_kernel"] == "padded"
    assert split_model.c_decode_pad < 0.5 * padded_model.c_decode_pad


def test_the_padded_kernel_pays_the_bubble_and_the_calibrated_term_predicts_it(make_checkpoint):
    torch.set_num_threads(1)
    loaded = load_checkpoint(make_checkpoint(**MODEL))
    skewed_s, even_s = _skewed_and_even_s(loaded, "padded")
    assert skewed_s > 1.5 * even_s  # equal context sums; the long row stretches every row's attention

    model, _, samples = calibrate(loaded, GRID, decode_kernel="padded", clock=time.process_time)
    feats = np.array([step_features(s) for s, _ in samples], dtype=float)
    feats[:, COEFFICIENTS.index("c_decode_pad")] = 0.0
    coef = nonneg_relative_lstsq(feats, np.array([t for _, t in samples]))
    shape = _Point(tuple((1, ctx - 1) for ctx in [SHORT] * (ROWS - 1) + [LONG])).shape

    def sum_only(s):
        return float(np.dot(step_features(s), coef))

    assert model.c_decode_pad > 0
    err_with = abs(model.step_time_s(shape) / skewed_s - 1)
    err_without = abs(sum_only(shape) / skewed_s - 1)
    assert err_with < err_without, (err_with, err_without)
