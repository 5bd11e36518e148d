"""docs/architecture.md: servelab's layers for a newcomer, and its import graph measured now and
at a base revision (cycles, back-edges against the layers, the largest modules).

    python scripts/architecture_report.py                 # write docs/architecture.md (base 1f6df5a)
    python scripts/architecture_report.py --check         # exit 1 on a cycle, a back-edge or a module > 450 lines
    python scripts/architecture_report.py --base REV --out FILE

Imports are read with ``ast`` (nothing is imported). Each edge has a kind: *run-time* (module
level), *lazy* (inside a function: runs when called, still a dependency) or *type-only* (under
``if TYPE_CHECKING:``). As in the project's hook (``shared/hooks/import_cycles.py``), an import
of a package's ``__init__`` is not an edge (it is the registry's way of loading every design)
and a module's length is its count of newline characters. Cycles are strongly connected
components of run-time + lazy edges, and separately of all edges (a type-only loop still ties
two modules together for a reader). A back-edge is an import from a lower layer into a higher
one (``LAYERS``).
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = "servelab"
LIMIT = 450
GUIDE = 400
BASE = "1f6df5a"

# (layer, module prefixes, what it holds), bottom first: a module may import its own layer and those below.
LAYERS: list[tuple[str, tuple[str, ...], str]] = [
    ("foundation", ("servelab.core", "servelab.metrics", "servelab.paths"),
     "the scheduling contract (requests, step plans, policies and routers as interfaces, registries), the "
     "instance runtime and KV blocks, the per-instance driver, metrics collection and summaries"),
    ("models", ("servelab.catalog", "servelab.costmodel", "servelab.workloads", "servelab.estimators",
                "servelab.trace"),
     "what the world looks like: GPUs and models, cost models (roofline, linear, links), workloads and traces, "
     "length estimators, step traces"),
    ("cluster", ("servelab.cluster",),
     "the cluster driver and what it owns: router views, KV transfers and moves, links, the KV pool, "
     "reconfiguration, pipeline groups, cluster configs and presets"),
    ("policies", ("servelab.baselines", "servelab.designs"),
     "policies and routers: the baselines and one folder per paper (its reproduction sits higher up)"),
    ("simulation", ("servelab.simulator", "servelab.api"),
     "the simulator (the cluster driver on a simulated clock) and the Python API over it"),
    ("engine and serving", ("servelab.engine", "servelab.server", "servelab.bench", "servelab.validate"),
     "the PyTorch engine (in process and on Ray), the OpenAI-compatible server, the bench client, fidelity checks"),
    ("reproductions", ("servelab.reproduce", "servelab.designs.*.reproduce"),
     "the reproduction runner (steps, seeds and intervals, claims, plots, registry, reproduce all) and each "
     "design's reproduction: settings, experiments, claims"),
    ("command line", ("servelab.cli", "servelab"),
     "the `servelab` commands"),
]


@dataclass
class Graph:
    lines: dict[str, int]  # module -> newline count
    edges: dict[tuple[str, str], set[str]] = field(default_factory=lambda: defaultdict(set))  # -> kinds

    def edges_of(self, kinds: set[str]) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {m: set() for m in self.lines}
        for (a, b), ks in self.edges.items():
            if ks & kinds:
                out[a].add(b)
        return out


def module_name(path: str) -> str:
    name = path[:-3].replace("/", ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def _imports(tree: ast.AST):
    """(node, kind) for every import: run-time at module level, lazy inside a function, type-only
    under ``if TYPE_CHECKING``."""
    todo = [(child, "run-time") for child in ast.iter_child_nodes(tree)]
    while todo:
        node, kind = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo += [(x, "type-only") for x in node.body] + [(x, kind) for x in node.orelse]
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, kind
            continue
        inner = "lazy" if kind == "run-time" and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                    ast.Lambda)) else kind
        todo += [(child, inner) for child in ast.iter_child_nodes(node)]


def build(sources: dict[str, str]) -> Graph:
    """The graph of ``sources`` (path relative to the repository -> text)."""
    mods = {module_name(p): p for p in sources}
    graph = Graph({m: sources[p].count("\n") for m, p in mods.items()})
    for mod, path in mods.items():
        for node, kind in _imports(ast.parse(sources[path])):
            for target in _targets(mod, path, node):
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != mod and target.startswith(PKG) and not mods[target].endswith("__init__.py"):
                    graph.edges[(mod, target)].add(kind)
    return graph


def _targets(mod: str, path: str, node) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        parts = mod.split(".")
        if not path.endswith("__init__.py"):
            parts = parts[:-1]
        parts = parts[: len(parts) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
    return [base] + [f"{base}.{a.name}" for a in node.names]


def layer_of(mod: str) -> int:
    best, best_len = len(LAYERS) - 1, -1
    for i, (_, prefixes, _) in enumerate(LAYERS):
        for prefix in prefixes:
            parts, mparts = prefix.split("."), mod.split(".")
            if len(mparts) < len(parts):
                continue
            if all(p == "*" or p == q for p, q in zip(parts, mparts)) and len(parts) > best_len:
                best, best_len = i, len(parts)
    return best


def cycles(adj: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on, stack, out, counter = set(), [], [], [0]
    for root in sorted(adj):
        if root in index:
            continue
        work = [(root, iter(sorted(adj[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(adj.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return sorted(out)


def back_edges(graph: Graph) -> list[tuple[str, str, str]]:
    """(importer, imported, kinds) where the importer's layer is below the imported one's."""
    return sorted((a, b, "/".join(sorted(k))) for (a, b), k in graph.edges.items() if layer_of(a) < layer_of(b))


@dataclass
class Measures:
    modules: int
    lines: int
    edges: Counter
    runtime_cycles: list[list[str]]
    all_cycles: list[list[str]]
    back: list[tuple[str, str, str]]
    long: list[tuple[int, str]]  # over LIMIT
    over_guide: int
    largest: list[tuple[int, str]]


def measure(graph: Graph) -> Measures:
    kinds = Counter(k for ks in graph.edges.values() for k in ks)
    by_size = sorted(((n, m) for m, n in graph.lines.items()), reverse=True)
    return Measures(len(graph.lines), sum(graph.lines.values()), kinds,
                    cycles(graph.edges_of({"run-time", "lazy"})),
                    cycles(graph.edges_of({"run-time", "lazy", "type-only"})), back_edges(graph),
                    [x for x in by_size if x[0] > LIMIT], sum(1 for n, _ in by_size if n > GUIDE), by_size[:12])


def working_tree() -> dict[str, str]:
    return {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in sorted((ROOT / PKG).rglob("*.py"))}


def at_revision(rev: str) -> dict[str, str]:
    names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", rev, PKG], check=True,
                           capture_output=True, text=True).stdout.split()
    return {n: subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{n}"], check=True, capture_output=True,
                              text=True).stdout for n in names if n.endswith(".py")}


def _short(mod: str) -> str:
    return mod.removeprefix(PKG + ".")


def _cycle_lines(found: list[list[str]]) -> list[str]:
    return [f"- {' <-> '.join(_short(m) for m in comp)}" for comp in found] or ["- none"]


def layers_section(graph: Graph) -> list[str]:
    packages: dict[int, set[str]] = defaultdict(set)
    for mod in graph.lines:
        parts = mod.split(".")
        if parts[1:2] == ["designs"]:
            name = "designs/*/reproduce" if len(parts) > 3 and parts[3] == "reproduce" else "designs/<paper>"
        else:
            name = parts[1] if len(parts) > 1 else "(package root)"
        packages[layer_of(mod)].add(name)
    width = max(len(name) for name, _, _ in LAYERS) + 4
    lines = ["## Layers: which package may import which", "",
             "Read from the top down: a module may import modules of its own layer and of the layers below it, "
             "never above. The designs' policies and routers sit with the baselines, below the simulator, which "
             "finds them by name through the registries; the designs' reproductions sit with the runner, above "
             "the engine, because they run both.", "", "```"]
    for i in reversed(range(len(LAYERS))):
        name = LAYERS[i][0]
        lines.append(f"{i + 1}. {name}".ljust(width) + ", ".join(sorted(packages[i])))
        if i:
            lines.append("    |")
    lines += ["```", "", "| layer | modules | holds |", "|---|---|---|"]
    for i, (name, prefixes, role) in enumerate(LAYERS):
        lines.append(f"| {i + 1}. {name} | {', '.join(f'`{p}`' for p in prefixes)} | {role} |")
    return lines + [""]


def package_matrix(graph: Graph) -> list[str]:
    def pkg(mod: str) -> str:
        parts = mod.split(".")
        if parts[1:2] == ["designs"] and len(parts) > 3 and parts[3] == "reproduce":
            return "designs/*/reproduce"
        if parts[1:2] == ["designs"]:
            return "designs"
        return parts[1] if len(parts) > 1 else PKG

    deps: dict[str, Counter] = defaultdict(Counter)
    for (a, b), _ in graph.edges.items():
        if pkg(a) != pkg(b):
            deps[pkg(a)][pkg(b)] += 1
    order = sorted({pkg(m) for m in graph.lines}, key=lambda p: (layer_of(PKG + "." + p.replace("/*/", ".x.")
                                                                          .replace("/", ".")), p))
    lines = ["## Who imports whom (packages, after)", "",
             "Imports (all kinds) from the package of the row into the package of the column; read it to see what "
             "a change to a package can touch.", "",
             "| package (layer) | imports |", "|---|---|"]
    for p in order:
        layer = layer_of(PKG + "." + p.replace("/*/", ".x.").replace("/", ".")) + 1
        lines.append(f"| {p} ({layer}) | " + ", ".join(f"{q} {n}" for q, n in sorted(deps[p].items())) + " |")
    return lines + [""]


def render(before: Measures | None, after: Measures, graph: Graph, base: str, command: str) -> str:
    def row(label: str, get) -> str:
        return f"| {label} | {get(before) if before else '-'} | {get(after)} |"

    out = ["# Architecture: layers and the import graph", "",
           f"Generated by `{command}`; do not edit by hand. Measured from the source with `ast` (nothing is "
           f"imported): *before* is revision `{base}` (the start of issue 30), *after* is the working tree this "
           "was made from. `python scripts/architecture_report.py --check` fails on an import cycle, a back-edge "
           f"or a module over {LIMIT} lines; tests/test_architecture.py runs it.", ""]
    out += layers_section(graph)
    out += ["## Measured: before and after", "",
            "| | before | after |", "|---|---|---|",
            row("modules", lambda m: m.modules), row("lines", lambda m: f"{m.lines:,}"),
            row("import edges: run-time / lazy / type-only",
                lambda m: f"{m.edges['run-time']} / {m.edges['lazy']} / {m.edges['type-only']}"),
            row("import cycles (run-time and lazy imports)", lambda m: len(m.runtime_cycles)),
            row("import cycles (type-only imports too)", lambda m: len(m.all_cycles)),
            row("back-edges (a lower layer importing a higher one)", lambda m: len(m.back)),
            row(f"modules over {LIMIT} lines (the limit)", lambda m: len(m.long)),
            row(f"modules over {GUIDE} lines (the guideline)", lambda m: m.over_guide),
            row("largest module", lambda m: f"{_short(m.largest[0][1])} ({m.largest[0][0]})"), ""]
    for label, key in (("Import cycles, run-time and lazy imports", "runtime_cycles"),
                       ("Import cycles, type-only imports included", "all_cycles")):
        out += [f"### {label}", "", "Before:", ""]
        out += _cycle_lines(getattr(before, key)) if before else ["- (base revision not available)"]
        out += ["", "After:", ""] + _cycle_lines(getattr(after, key)) + [""]
    out += ["### Back-edges", "", "Before:", ""]
    out += ([f"- {_short(a)} -> {_short(b)} ({k})" for a, b, k in before.back] or ["- none"]) if before else ["- -"]
    out += ["", "After:", ""] + ([f"- {_short(a)} -> {_short(b)} ({k})" for a, b, k in after.back] or ["- none"])
    out += ["", "### Largest modules (lines)", "", "| before | lines | after | lines |", "|---|---|---|---|"]
    for i in range(len(after.largest)):
        b = before.largest[i] if before and i < len(before.largest) else (None, "-")
        a = after.largest[i]
        out.append(f"| {_short(b[1])} | {b[0] if b[0] is not None else '-'} | {_short(a[1])} | {a[0]} |")
    out.append("")
    out += package_matrix(graph)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default=BASE, help="git revision measured as *before*")
    ap.add_argument("--out", default=str(ROOT / "docs" / "architecture.md"))
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 on a cycle, back-edge or long module")
    args = ap.parse_args(argv)
    graph = build(working_tree())
    after = measure(graph)
    if args.check:
        problems = [f"cycle: {' <-> '.join(c)}" for c in after.all_cycles]
        problems += [f"back-edge: {a} -> {b} ({k})" for a, b, k in after.back]
        problems += [f"long: {m} {n} lines" for n, m in after.long]
        print("\n".join(problems) or f"no cycles, no back-edges, no module over {LIMIT} lines")
        return 1 if problems else 0
    try:
        before = measure(build(at_revision(args.base)))
    except (subprocess.CalledProcessError, FileNotFoundError) as err:
        print(f"base revision {args.base} not readable ({err}); writing without the before column", file=sys.stderr)
        before = None
    command = "python scripts/architecture_report.py" + (f" --base {args.base}" if args.base != BASE else "")
    Path(args.out).write_text(render(before, after, graph, args.base, command) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
