"""Test helpers shared across folders (a unique module name, so no conftest clash)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np

from servelab.core.plan import StepShape
from servelab.core.request import RequestSpec
from servelab.paths import default_data_dir

DATA_DIR = default_data_dir()
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str):
    """scripts/<name>.py as a module, for tests of a script's functions (scripts/ is not a
    package; it is on sys.path while the script loads, as when it runs, for its sibling imports)."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPTS))
    return module


class ToyCostModel:
    """Linear step time: a fixed cost plus per-token and per-context terms (fast, exact)."""

    def __init__(self, step_s=0.005, token_s=1e-4, ctx_s=1e-7) -> None:
        self.step_s, self.token_s, self.ctx_s = step_s, token_s, ctx_s

    def step_time_s(self, shape: StepShape) -> float:
        if shape.padding is not None:
            p = shape.padding
            return self.step_s + self.token_s * p.num_rows * p.row_tokens + self.ctx_s * p.num_rows * p.context_tokens
        ctx = shape.decode_context_sum + sum(shape.prefill_context)
        return self.step_s + self.token_s * shape.num_tokens + self.ctx_s * ctx

    def decode_step_times_s(self, num_decodes: int, context_sums: np.ndarray, context_maxes=None) -> np.ndarray:
        return self.step_s + self.token_s * num_decodes + self.ctx_s * np.asarray(context_sums, dtype=np.float64)


def random_workload(n: int, seed: int, *, rate: float = 20.0, max_prompt: int = 300, max_output: int = 120):
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1 / rate, n))
    prompts = rng.integers(1, max_prompt, n)
    outputs = rng.integers(1, max_output, n)
    return [RequestSpec(i, float(times[i]), int(prompts[i]), int(outputs[i]), predicted_output_tokens=int(outputs[i]),
                        priority=int(rng.integers(0, 3))) for i in range(n)]


_SET_UP_PIDS: list[int] = []  # the processes in which ``fanout_setup`` ran


def fanout_setup() -> None:
    """A ``Fanout`` worker setup that leaves a mark in its process (module-level: workers import it)."""
    _SET_UP_PIDS.append(os.getpid())


def fanout_probe(item):
    """(item, whether ``fanout_setup`` ran in this process before the item, how often it ran here)."""
    return item, os.getpid() in _SET_UP_PIDS, _SET_UP_PIDS.count(os.getpid())
