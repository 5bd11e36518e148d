"""A reproduction small enough for the runner's tests: three steps, one reading another's
result, a temporary folder, a claims table with a premise, and a variant."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from servelab.reproduce.claims import Claim, Premise, claims_lines
from servelab.reproduce.runner import Reproduction, Run, Step, Variant


@dataclass(frozen=True)
class Sizes:
    n: int = 10
    fail_at: str = ""  # a step label that raises (KeyboardInterrupt, or SIGTERM with "sigterm:")


def _maybe_fail(run: Run, label: str) -> None:
    if run.sizes.fail_at == label:
        raise KeyboardInterrupt
    if run.sizes.fail_at == "sigterm:" + label:
        os.kill(os.getpid(), signal.SIGTERM)


def _squares(run: Run) -> list[int]:
    tmp = run.tmp_dir("work")
    (tmp / "scratch").write_text("x" * 1000)
    run.results["tmp_dir"] = str(tmp)
    _maybe_fail(run, "squares")
    return [i * i for i in range(run.sizes.n)]


def _total(run: Run) -> int:
    _maybe_fail(run, "total")
    return sum(run.results["rows"]["squares"])


def _over_seeds(run: Run) -> dict:
    runs = run.over_seeds(lambda seed: {"value": float(seed)})
    return {"interval": str(runs.interval("value")), "seeds": list(runs.seeds)}


def _steps(run: Run) -> list[Step]:
    return [Step("squares", _squares, ("rows", "squares")), Step("total", _total, "total"),
            Step("seeds", _over_seeds, "seeds")]


def _write(run: Run) -> dict:
    claim = Claim("total is the sum of squares", "285", str(run.results["total"]), f"n={run.sizes.n}",
                  "reached" if run.results["total"] == 285 else "not reached",
                  (Premise("rows", str(run.sizes.n), "= 10", run.sizes.n == 10),))
    run.report_path.write_text("# toy\n\n" + "\n".join(claims_lines([claim])) + "\n")
    return run.results


REPRODUCTION = Reproduction("toy", {"full": Sizes(), "reduced": Sizes(n=4)}, _steps, _write,
                            json_name="{stem}.json", variants=(Variant("small", "n = 3", sizes={"n": 3}),),
                            default_seeds=2)
