"""The import graph stays acyclic and layered, and no module passes 450 lines
(``scripts/architecture_report.py``, which also writes docs/architecture.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "architecture_report.py"
spec = importlib.util.spec_from_file_location("architecture_report", SCRIPT)
arch = sys.modules.setdefault("architecture_report", importlib.util.module_from_spec(spec))
spec.loader.exec_module(arch)


def test_servelab_has_no_cycle_no_back_edge_and_no_long_module():
    m = arch.measure(arch.build(arch.working_tree()))
    assert m.all_cycles == [], m.all_cycles  # type-only loops included
    assert m.back == [], m.back
    assert m.long == [], m.long


def test_the_checks_see_what_they_look_for():
    sources = {
        "servelab/__init__.py": "",
        "servelab/core/__init__.py": "",
        "servelab/core/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from servelab.core.b import B\n",
        "servelab/core/b.py": "def f():\n    from servelab.core import a\n",
        "servelab/core/c.py": "import servelab.cli.main\n" + "x = 1\n" * 460,
        "servelab/cli/__init__.py": "",
        "servelab/cli/main.py": "from servelab.core.c import x\n",
    }
    graph = arch.build(sources)
    assert graph.edges[("servelab.core.a", "servelab.core.b")] == {"type-only"}
    assert graph.edges[("servelab.core.b", "servelab.core.a")] == {"lazy"}
    m = arch.measure(graph)
    assert m.all_cycles == [["servelab.cli.main", "servelab.core.c"], ["servelab.core.a", "servelab.core.b"]]
    assert m.runtime_cycles == [["servelab.cli.main", "servelab.core.c"]]
    assert m.back == [("servelab.core.c", "servelab.cli.main", "run-time")]
    assert m.long == [(461, "servelab.core.c")]


def test_layers_place_reproductions_above_the_engine_and_policies_below_the_simulator():
    order = [arch.layer_of(m) for m in ("servelab.core.request", "servelab.costmodel.roofline",
                                        "servelab.cluster.driver", "servelab.designs.kunserve.router",
                                        "servelab.simulator.run", "servelab.engine.runner",
                                        "servelab.designs.kunserve.reproduce.run", "servelab.cli.main")]
    assert order == sorted(order) and len(set(order)) == len(order)
