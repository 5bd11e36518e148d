"""Where the test suite's CPU goes: sums the per-test log that tests/conftest.py writes.

    SERVELAB_TEST_CPU_LOG=/tmp/cpu bash scripts/test.sh
    .venv/bin/python scripts/test_cpu_report.py /tmp/cpu [--top 30] [--workers 2]

CI gives the suite 10 minutes on 2 cores. CPU seconds (the test's process and the children it
waited for) do not move with the machine's load the way wall time does, so they say which tests
the budget is spent on. ``--workers`` also prints the longest worker of a greedy longest-first
packing of the tests' wall times: the least the suite's wall time could be with that many workers
when one test runs alone on each.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from collections import defaultdict
from pathlib import Path


def load(folder: Path) -> list[dict]:
    rows = []
    for path in sorted(folder.glob("*.jsonl")):
        for k, line in enumerate(path.read_text().splitlines(), 1):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                sys.exit(f"{path}:{k}: not a JSON line: {line[:80]!r}")
    return rows


def packed_wall_s(walls: list[float], workers: int) -> float:
    loads = [0.0] * workers
    for wall in sorted(walls, reverse=True):
        heapq.heappush(loads, heapq.heappop(loads) + wall)
    return max(loads)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    if not args.folder.is_dir():
        sys.exit(f"{args.folder}: no such folder (set SERVELAB_TEST_CPU_LOG to it when running the tests)")
    rows = load(args.folder)
    if not rows:
        sys.exit(f"{args.folder}: no test lines in *.jsonl")
    total = sum(r["cpu_s"] for r in rows)
    by_file: dict[str, float] = defaultdict(float)
    for r in rows:
        by_file[r["test"].split("::")[0]] += r["cpu_s"]
    print(f"{len(rows)} tests, {total:.0f} CPU-s in all, {sum(r['wall_s'] for r in rows):.0f} s of test wall time; "
          f"packed on {args.workers} workers: {packed_wall_s([r['wall_s'] for r in rows], args.workers):.0f} s")
    print(f"\nslowest {args.top} tests by CPU s (wall s)")
    for r in sorted(rows, key=lambda r: -r["cpu_s"])[:args.top]:
        print(f"{r['cpu_s']:8.1f} {r['wall_s']:8.1f}  {r['test']}")
    print(f"\nslowest {args.top} files by CPU s")
    for name, cpu in sorted(by_file.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"{cpu:8.1f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
