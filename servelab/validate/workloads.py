"""Workloads for validation: request specs the engine can run (token ids) and the simulator
can replay (the same arrival times and lengths).

A text workload (gsm8k) is tokenised by the checkpoint's tokenizer; a length-only workload
(a trace slice, a synthetic mix) gets seeded random token ids of its prompt lengths: a
random-weight model's step time depends on shapes, not on which tokens they are. Lengths
are capped (``max_prompt``, ``max_output``) so a CPU run stays seconds long; the cap is part
of the workload's name in every report.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from servelab.core.errors import UserError
from servelab.core.request import RequestSpec


@dataclass(frozen=True, slots=True)
class ValidationWorkload:
    """A workload spec plus the caps that keep it small enough for a CPU engine run."""

    name: str
    spec: str
    max_prompt: int
    max_output: int

    def __post_init__(self) -> None:
        if self.max_prompt < 1 or self.max_output < 1:
            raise UserError(f"workload {self.name}: max_prompt and max_output must be >= 1")

    @property
    def label(self) -> str:
        return f"{self.spec} (prompt <= {self.max_prompt}, output <= {self.max_output})"


# The three workloads of docs/fidelity.md, reduced for a shared 2-core CPU.
FIDELITY_WORKLOADS = (
    ValidationWorkload("gsm8k", "gsm8k:n=10,rate=1", 256, 24),
    ValidationWorkload("azure-conv", "azure-conv:window=0-600,n=10,rate=1", 256, 24),
    ValidationWorkload("long-short", "poisson:rate=1,n=10,lengths=mix(alpaca:0.7,longbench:0.3)", 512, 24),
)


def engine_specs(workload: ValidationWorkload, tokenizer, vocab_size: int, *, data_dir: Path, seed: int
                 ) -> list[RequestSpec]:
    """The workload's requests with ``prompt_token_ids`` (capped), same arrival times."""
    from servelab import api

    specs = api.load_workload(workload.spec, data_dir=data_dir, seed=seed)
    if not specs:
        raise UserError(f"workload {workload.spec!r} has no requests")
    rng = np.random.default_rng(seed)
    out = []
    for s in specs:
        if s.prompt_text is not None:
            ids = tuple(tokenizer.encode(s.prompt_text).ids)
        else:
            ids = tuple(int(x) for x in rng.integers(3, vocab_size, size=s.num_prompt_tokens))
        ids = ids[:workload.max_prompt] or (3,)
        out.append(replace(s, num_prompt_tokens=len(ids), prompt_token_ids=ids, prompt_text=None,
                           num_output_tokens=max(1, min(s.num_output_tokens, workload.max_output))))
    return out


def parse_validation_workload(text: str, max_prompt: int, max_output: int) -> ValidationWorkload:
    """A command-line ``--workload``: one of FIDELITY_WORKLOADS by name, or any workload spec."""
    for w in FIDELITY_WORKLOADS:
        if text == w.name:
            return w
    return ValidationWorkload(text.split(":", 1)[0], text, max_prompt, max_output)
