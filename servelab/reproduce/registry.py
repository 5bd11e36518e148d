"""Every reproduction ``servelab reproduce NAME`` can run: what the CLI needs to list, describe
and parse it without importing the design (``servelab --help`` stays fast and torch-free).

The steps live with the design (``module``'s ``REPRODUCTION``); an entry here holds its name,
paper, one-line summary, its own command-line options, and the CPU time it took on the
2-core development VM (the duration ``--help`` states and the ETA starts from):

* reduced sizes: ``servelab reproduce NAME --reduced`` on this code (issue 30), the sum of the
  steps' CPU seconds, rounded up (multibin 9.8, bucketserve 27.2 with the engine step,
  dynaserve 59.8, alignedserve 26.6 with the engine step, kunserve 70.0, multibin-engine 62.5);
* full sizes: the sum of the step CPU times recorded in the committed full runs
  (``docs/reproduction/<name>.json``: bucketserve 269, dynaserve 556, kunserve 400,
  alignedserve 94; multibin: the step table of multibin.md, 57); multibin-engine: a full run on
  this code, 1,012 CPU-s (31 min wall) while other sessions loaded the machine: its torch steps
  slow down under load (the committed run, on a quieter machine, states 5 min of Figure 7).

AlignedServe since issue 25 (headline grid over kernels and seeds, figures over seeds): reduced
104 and full 591 CPU-s (the committed run; 644 in the run before it), each the sum of its steps
measured on this code (nice 19, shared machine). Issue 25's session 5 (sustained load 200 req/s x
4000 requests, the Fig. 14 gap step, the switch test's unbounded variant): reduced 224 CPU-s
without the engine step (load ~4 on 2 cores); a full run was stopped after 10.9 CPU-min still in
the headline grid (load ~10, where every step took 2-4x its CPU-s of the committed run). The
committed full run (a3768b0) took 2,376 CPU-s; issue 25's six gap-test steps (``open_gaps``), run
alone, 543 more (load 7-21): full estimate 2,900.

DynaServe since issue 26 (capacity on a rate grid over 3 seeds, both delay rules, nine variants):
reduced measured on this code (the sum of its steps, rounded up); full not run on this code,
estimated as 9x the reduced (the ratio of the two sizes before, 560 / 60).

Wall time equals CPU time only on an idle machine; on a shared one it was 1.5-3x here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional


@dataclass(frozen=True)
class Option:
    """A design's own option: ``--name`` (``--name/--no-name`` for a bool), passed to its steps
    in ``run.options[name]``."""

    name: str  # python name; the flag is ``--`` + name with ``-`` for ``_``
    default: Any
    help: str
    type: Any = None  # None: the default's type (int, str, bool); Optional[Path] for a path that may be absent

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class Entry:
    name: str  # ``servelab reproduce NAME``; the report is NAME.md
    title: str
    paper: str  # the paper's page in ../shared/papers (empty: the same paper as another entry)
    module: str  # holds ``REPRODUCTION``
    summary: str  # the command's help text, first line
    cpu_s: dict[str, float]  # measured CPU seconds: "reduced", "full"
    options: tuple[Option, ...] = ()
    variants: tuple[str, ...] = ()  # names of the reproduction's variants (``--variant``)
    seeds: bool = False  # whether its experiments repeat over ``--seeds N``
    in_all: bool = True  # part of ``servelab reproduce all``
    has_reduced: bool = True

    def duration_text(self) -> str:
        def fmt(s: float) -> str:
            return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min"

        parts = [f"about {fmt(self.cpu_s[size])} of CPU {size}" for size in ("reduced", "full") if size in self.cpu_s]
        return "Takes " + ", ".join(parts) + " (measured on a 2-core VM; wall time grows with the machine's load)."

    def load(self):
        """The design's ``Reproduction`` (imports the design)."""
        return importlib.import_module(self.module).REPRODUCTION


REPRODUCTIONS: tuple[Entry, ...] = (
    Entry("multibin", "Multi-Bin Batching", "multibin.md", "servelab.designs.multibin.reproduce.run",
          "Multi-Bin Batching: Figures 3, 4, 6, 7, 8 against the closed forms and the paper (simulated).",
          {"reduced": 10, "full": 60}),
    Entry("multibin-engine", "Multi-Bin Batching on the engine", "", "servelab.designs.multibin.reproduce.engine_run",
          "Multi-Bin Batching Figures 5 and 7 measured on the real engine (CPU), next to the simulators.",
          {"reduced": 65, "full": 1020},
          options=(Option("num_requests", None, "GSM8K requests in the Figure 7 burst (default: 128, reduced 16; "
                                                "the paper uses all 7473).", Optional[int]),
                   Option("ks", None, "Comma-separated numbers of bins (default: 1,2,4,8,16; reduced 1,2).",
                          Optional[str]),
                   Option("model", None, "Checkpoint folder; default: make the bench-30m preset in a temporary "
                                         "folder (removed at the end, also on Ctrl-C).", Optional[Path]),
                   Option("threads", 1, "torch threads (1 is fastest on a shared 2-core machine).")),
          in_all=False),
    Entry("bucketserve", "BucketServe", "bucketserve.md", "servelab.designs.bucketserve.reproduce.run",
          "BucketServe: its claims at the paper's operating points against UELLM and DistServe, and the gap tests.",
          {"reduced": 30, "full": 270},
          options=(Option("engine", True, "Also measure ragged vs padded bucket prefills on the real engine "
                                          "(CPU, needs torch)."),
                   Option("smoke", False, "Sizes so small the numbers mean nothing (about 15 CPU-s without the "
                                          "engine step): every step and claim row runs, to check the command works "
                                          "here."))),
    Entry("dynaserve", "DynaServe", "dynaserve.md", "servelab.designs.dynaserve.reproduce.run",
          "DynaServe: capacity on a rate grid over seeds (median and P99 delay rules), the paper's deployment "
          "against servelab's variants, goodput, Table 1/2/4, Figs. 5/11, chunked transfer and scheduler time vs PD "
          "colocation (sarathi) and 1P1D disaggregation, with the gap tests (simulated).",
          {"reduced": 780, "full": 5000}, seeds=True,
          options=(Option("smoke", False, "Sizes so small the numbers mean nothing (about 20 CPU-s a seed): every "
                                          "step and claim row runs, to check the command works here."),)),
    Entry("alignedserve", "AlignedServe", "alignedserve.md", "servelab.designs.alignedserve.reproduce.run",
          "AlignedServe: Figs. 1/3 (simulated, and measured on the CPU engine), 7-15, the batch-switch share, pool "
          "occupancy and Density First Search time against vllm, distserve and a FastGen stand-in, with the gap "
          "tests (simulated).",
          {"reduced": 240, "full": 2900},
          options=(Option("engine", True, "Also measure Figure 1's trend on the real engine (CPU, needs torch)."),)),
    Entry("kunserve", "KunServe", "kunserve.md", "servelab.designs.kunserve.reproduce.run",
          "KunServe: Figs. 12-16 (P99 TTFT, TPOT, SLO violation, ablation, restore, extreme bursts) and the "
          "drop-plan time against vllm, vllm-pp, infercept and llumnix, with the gap tests (simulated).",
          {"reduced": 246, "full": 1239}),
)


def entry(name: str) -> Entry:
    for e in REPRODUCTIONS:
        if e.name == name:
            return e
    raise KeyError(f"unknown reproduction {name!r}; known: {', '.join(e.name for e in REPRODUCTIONS)}")
