"""The claims adapters of ``servelab reproduce all``: tables read from each design's report,
verdicts found in either column style, reduced against full compared claim by claim."""

from __future__ import annotations

import json
import os
from pathlib import Path

from servelab.reproduce.all import PAPERS_DIR, readme_text, rebuild_readme
from servelab.reproduce.claims import Claim, claims_of, verdict_of

MULTIBIN_STYLE = """# x

| claim | paper | ours | gap |
|---|---|---|---|
| Fig. 3: saturated throughput = Theorem 4.2 (k=1..5) | agrees | max error 0.31 % | reached |
| Fig. 7: throughput | +70 % | +62 % | not reached: lengths differ |

| claim | other table |
|---|---|
| ignored | x |
"""
BUCKET_STYLE = """| claim | paper | before | after | operating point | verdict |
|---|---|---|---|---|---|
| offline throughput | 3.58 | 9.0 | 3.62 | mixed, offline | reached |
"""


def test_claims_are_read_from_either_column_style():
    multibin = claims_of(MULTIBIN_STYLE)
    assert [c.verdict for c in multibin] == ["reached", "not reached"]
    assert multibin[0].ours == "max error 0.31 %" and multibin[0].operating_point == "-"
    bucket = claims_of(BUCKET_STYLE)
    assert bucket == [Claim("offline throughput", "3.58", "3.62", "mixed, offline", "reached")]
    assert verdict_of({"gap": "the paper rounds up"}) == "-"
    assert claims_of("no table here") == []


def test_readme_compares_reduced_with_full_and_explains_fig3(tmp_path):
    (tmp_path / "multibin.md").write_text(MULTIBIN_STYLE)
    reduced = [{"claim": "Fig. 3: saturated throughput = Theorem 4.2 (k=1..5)", "paper": "agrees",
                "ours": "max error 3.0 %", "operating_point": "-", "verdict": "not reached"},
               {"claim": "Fig. 7: throughput", "paper": "+70 %", "ours": "+60 %", "operating_point": "-",
                "verdict": "not reached"}]
    tail = {"num_requests": 12800, "max_err_makespan": 0.03, "max_err_full_batches": 0.004}
    payload = {"command": "servelab reproduce all", "reduced_dir": "r",
               "runs": {"multibin": {"error": None, "cpu_s": 5.0, "fig3_tail": tail,
                                     "fig3_scaling": [tail]},
                        "kunserve": {"error": "RuntimeError: boom", "cpu_s": 1.0}},
               "reduced_claims": {"multibin": reduced}}
    text = readme_text(tmp_path, payload)
    assert "makespan throughput is off Theorem 4.2 by 3.00% but the same run's full batches by 0.40%" in text
    assert "| Fig. 7: throughput | +70 % | +62 % | - | not reached | not reached | agree |" in text
    assert "The reduced run failed: RuntimeError: boom" in text
    assert "No full report yet" in text  # the designs without a full report say so
    (tmp_path / "README.json").write_text(json.dumps(payload))
    rebuilt = rebuild_readme(tmp_path).read_text()
    assert rebuilt == readme_text(tmp_path, json.loads((tmp_path / "README.json").read_text()) | {
        "papers_link": os.path.relpath(PAPERS_DIR, tmp_path.resolve())})


def test_readme_links_the_papers_from_wherever_it_is_written(tmp_path):
    """Issue 31: the paper links were '../shared/papers/...' whatever the README's folder
    (wrong from docs/reproduction and from a fresh folder's results/reproduction)."""
    import re

    from servelab.reproduce.all import write_readme

    deep = tmp_path / "a" / "b"
    text = write_readme(deep, {"command": "c", "reduced_dir": "r", "runs": {}, "reduced_claims": {}},
                        tmp_path).read_text()
    links = re.findall(r"Paper: \[[^]]+\]\(([^)]+)\)", text)
    assert len(links) == 5
    for link in links:
        assert (deep / link).resolve() == (PAPERS_DIR / Path(link).name).resolve()
    if PAPERS_DIR.is_dir():
        assert all((deep / link).is_file() for link in links)


def test_readme_only_keeps_readme_md_what_readme_json_gives(tmp_path):
    """`reproduce all --readme-only` put the papers' link into README.md but not README.json, so
    the committed pair disagreed (tests/test_reports_regenerate.py failed after a rebuild)."""
    import json

    from servelab.reproduce.all import readme_text, rebuild_readme

    payload = {"command": "c", "reduced_dir": "r", "runs": {}, "reduced_claims": {}}  # as written before the link
    (tmp_path / "README.json").write_text(json.dumps(payload))
    readme = rebuild_readme(tmp_path)
    assert readme_text(tmp_path, json.loads((tmp_path / "README.json").read_text())) == readme.read_text()


def test_only_keeps_the_other_designs_runs_from_the_readme_it_rewrites(tmp_path, monkeypatch):
    """`reproduce all --only A` then `--only B` into one folder left only B's run (and CPU time)
    in README.json and README.md: every other design's row lost its reduced-run CPU time."""
    import servelab.reproduce.all as all_mod

    names = [e.name for e in all_mod.designs()]
    first, second = names[0], names[1]
    monkeypatch.setattr(all_mod, "run_one", lambda entry, out, **_kw: {"error": None, "cpu_s": 11.0 + len(entry.name)})
    for only in ((first,), (second,)):
        all_mod.reproduce_all(out_dir=tmp_path, full_dir=tmp_path, full=False, seed=0, command="c", only=only)
    runs = json.loads((tmp_path / "README.json").read_text())["runs"]
    assert set(runs) == {first, second}
    assert runs[first]["cpu_s"] == 11.0 + len(first)
    all_mod.reproduce_all(out_dir=tmp_path, full_dir=tmp_path, full=False, seed=0, command="c", only=(first,))
    assert set(json.loads((tmp_path / "README.json").read_text())["runs"]) == {first, second}
