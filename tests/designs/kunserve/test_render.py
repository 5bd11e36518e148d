"""Rendering the report from standalone steps over a rendered run: every section names the run
it comes from, the previous render's own record of its sources kept for what was not rerun."""

from __future__ import annotations

import json

from servelab.designs.kunserve.reproduce import render


def _previous():
    # a render whose steps ran at commit X, with two sections from an earlier same-code run
    # and two from older code
    return {"reduced": False, "seed": 0, "sizes": {"s": 1}, "clusters": {"A": 1},
            "end_to_end": {"a-14B": 1, "b-14B": 2}, "gap_pp": 3, "faithful_grid": 4, "gap_merge": 5, "restore": 6,
            "timings_cpu_s": {"old": 1.0},
            "reused": {"from": "run Y (same code)", "sections": ["faithful_grid"], "steps_run": ["restore (Fig. 15)"],
                       "same_code": True, "older": {"from": "old code Z", "sections": ["end to end b-14B", "gap_merge"]}}}


def test_each_section_names_its_run_and_rerun_steps_replace_the_older_ones():
    steps = {"results": {"end_to_end": {"b-14B": 20}, "gap_merge": 50}, "timings_cpu_s": {"merge": 9.0}}
    mine = {"results": {"gap_residual": 7, "gap_merge": 99}, "timings_cpu_s": {"residual": 2.0}}
    res = render.with_sources([(steps, "steps at main"), (mine, "steps at branch")], _previous(), "render at X")
    assert res["end_to_end"] == {"a-14B": 1, "b-14B": 20} and res["gap_merge"] == 50  # the first file wins
    assert res["gap_residual"] == 7 and res["gap_pp"] == 3 and res["sizes"] == {"s": 1}  # settings kept
    assert res["sources"] == {"end to end a-14B": "render at X", "end to end b-14B": "steps at main",
                              "gap_pp": "render at X", "gap_residual": "steps at branch",
                              "faithful_grid": "run Y (same code)", "restore": "render at X",
                              "gap_merge": "steps at main"}
    assert "reused" not in res and res["timings_cpu_s"] == {"old": 1.0, "merge": 9.0, "residual": 2.0}
    # rendered again, its own sources are read back, not re-derived
    again = render.with_sources([], res, "ignored")
    assert again["sources"] == res["sources"]


def test_the_report_head_lists_sections_by_run():
    from servelab.designs.kunserve.reproduce.report import source_lines

    lines = source_lines({"end to end a-14B": "run P", "gap_pp": "run Q", "restore": "run P"}, "cmd")
    assert "- run P: end to end a-14B, restore" in lines and "- run Q: gap_pp" in lines


def test_sources_needs_a_label_per_partial(tmp_path, capsys):
    p = tmp_path / "p.json"
    p.write_text('{"results": {}}')
    assert render.main(["--partial", str(p), "--previous", str(p), "--previous-label", "x", "--sources",
                        "--out", str(tmp_path)]) == 2
    assert "--partial-label" in capsys.readouterr().err


def test_a_section_still_from_older_code_says_so():
    src = render.sources_of(_previous(), "render at X")
    assert src["gap_merge"].startswith("old code Z (older simulation code")
    assert src["faithful_grid"] == "run Y (same code)" and src["restore"] == "render at X"


def test_a_note_names_the_default_a_section_ran_under_and_an_unknown_section_is_refused(tmp_path, capsys):
    notes = render.parse_notes(["gap_pp|restore=old default", "restore=no group forms"])
    assert notes == {"gap_pp": "old default", "restore": "old default; no group forms"}
    res = render.with_sources([({"results": {"gap_pp": 30}}, "steps at B")], _previous(), "render at X", notes)
    assert res["sources"]["gap_pp"] == "steps at B [old default]"
    assert res["sources"]["restore"] == "render at X [old default; no group forms]"
    assert res["sources"]["faithful_grid"] == "run Y (same code)"  # no note: its label as it was
    p = tmp_path / "p.json"
    p.write_text('{"results": {}}')
    prev = tmp_path / "prev.json"
    prev.write_text(json.dumps(_previous()))
    args = ["--partial", str(p), "--partial-label", "l", "--previous", str(prev), "--previous-label", "x",
            "--sources", "--out", str(tmp_path)]
    assert render.main(args + ["--note", "gap_nothing=x"]) == 2
    assert "gap_nothing" in capsys.readouterr().err
    assert render.main(args + ["--note", "no equals sign"]) == 2
    assert "section[|section...]=text" in capsys.readouterr().err


def test_the_results_json_keeps_memory_timelines_only_where_a_figure_plots_them():
    from servelab.designs.kunserve.reproduce.run import UNPLOTTED, _to_json

    mem = {"t": [0.123456, 1.0], "used_gb": [1.23456789, 2.0]}
    run = {"memory": mem, "ttft_s": {"99": 1.5}}
    res = {"restore": {"runs": {"kunserve": run}}, "extreme": {"runs": {"kunserve": run}},
           "gap_merge": {"runs": {"kunserve": run}, "seeds": [{"seed": 0, "runs": {"kunserve": {"ttft_s": {"99": 1.5}}}}]}}
    out = _to_json(res)
    assert "gap_merge" in UNPLOTTED and out["gap_merge"]["runs"]["kunserve"] == {"ttft_s": {"99": 1.5}}
    assert out["gap_merge"]["seeds"] == res["gap_merge"]["seeds"]  # the summaries the report reads are kept
    assert out["restore"]["runs"]["kunserve"]["memory"]["used_gb"] == [1.235, 2.0]  # plotted: kept, 4 digits
    assert out["extreme"]["runs"]["kunserve"]["memory"]["t"] == [0.1235, 1.0]
    assert res["gap_merge"]["runs"]["kunserve"]["memory"] is mem  # the results in memory are not changed
