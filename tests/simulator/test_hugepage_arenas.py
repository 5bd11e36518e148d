"""servelab.simulator.hugepage_arenas: pymalloc's arenas from one huge-page region, same
simulated results, and Python's own allocator where it cannot or should not be used. Each
case runs in a process of its own: the arena allocator is process-wide and stays."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]

# THP_MODE_FILE: a stand-in for /sys/kernel/mm/transparent_hugepage/enabled, so each case runs
# whatever mode this machine is in (the region is only advised to use huge pages; it works
# as an arena source without them)
CHURN = r"""
import json, os, sys
from pathlib import Path
from servelab.simulator import hugepage_arenas
hugepage_arenas.THP_MODE = Path(os.environ["THP_MODE_FILE"])
ok = hugepage_arenas.install()
if not ok:
    print(json.dumps({"installed": False, "why": hugepage_arenas.why_not})); sys.exit(0)
rounds = []
for r in range(3):  # arenas filled, freed (kept for reuse) and filled again
    objs = [{"i": i, "s": str(i)} for i in range(200_000)]
    rounds.append(sum(o["i"] for o in objs) == sum(range(200_000)) and objs[123_456]["s"] == "123456")
    used = hugepage_arenas.region_bytes()
    del objs
print(json.dumps({"installed": True, "rounds": rounds, "region": used, "region_after": hugepage_arenas.region_bytes(),
                  "again": hugepage_arenas.install()}))
"""


def _python(code: str, tmp_path: Path, thp: str = "always [madvise] never", **env: str) -> dict:
    (tmp_path / "thp_enabled").write_text(thp + "\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "SERVELAB_CACHE": str(tmp_path),
                               "THP_MODE_FILE": str(tmp_path / "thp_enabled"), **env})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_objects_live_in_the_region_and_freed_arenas_are_reused(tmp_path):
    out = _python(CHURN, tmp_path)
    assert out["installed"], out["why"]
    assert out["rounds"] == [True, True, True]
    assert out["region"] > 20 * 2**20  # 200k dicts: tens of MiB of arenas, all from the region
    # the second and third rounds reused the first round's arenas instead of cutting new ones
    assert out["region_after"] < 2 * out["region"]
    assert out["again"] is True  # a second install is a no-op that reports it is in place


def test_opt_out_keeps_pythons_allocator(tmp_path):
    out = _python(CHURN, tmp_path, SERVELAB_HUGEPAGE_ARENAS="0")
    assert out == {"installed": False, "why": "SERVELAB_HUGEPAGE_ARENAS=0"}


def test_no_compiler_keeps_pythons_allocator(tmp_path):
    out = _python(CHURN, tmp_path, CC="no-such-compiler-servelab")
    assert out["installed"] is False and "no C compiler 'no-such-compiler-servelab'" in out["why"]


def test_huge_pages_off_keeps_pythons_allocator(tmp_path):
    out = _python(CHURN, tmp_path, thp="always madvise [never]")
    assert out == {"installed": False, "why": "transparent huge pages are off (never)"}


def test_perf_scale_gives_the_same_results_on_either_allocator(tmp_path):
    code = ("import sys; from servelab.cli.main import app; "
            "sys.argv = ['servelab', 'perf', 'scale', '--instances', '4', '--requests', '40']; app()")

    def point(**env: str) -> dict:
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "SERVELAB_CACHE": str(tmp_path), **env})
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout)

    huge, plain = point(), point(SERVELAB_HUGEPAGE_ARENAS="0")
    assert plain["hugepage_arenas"] == "SERVELAB_HUGEPAGE_ARENAS=0"
    assert huge["hugepage_arenas"] in ("yes", "transparent huge pages are off (never)")
    assert huge["fingerprints"] == plain["fingerprints"] and huge["output_tokens"] == plain["output_tokens"]
