"""``servelab reproduce``: one command per registry entry stating its measured duration, bad
options as one line before any work, and ``reproduce all`` writing where it says (a fresh
folder's ``results/reproduction``), never over the committed docs unless asked."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servelab.cli.main import app
from servelab.reproduce import all as reproduce_all
from servelab.reproduce.registry import REPRODUCTIONS, Entry

sys.path.insert(0, str(Path(__file__).parent))
runner = CliRunner()
REPO_README = Path(__file__).resolve().parents[2] / "docs" / "reproduction" / "README.md"
TOY = Entry("toy", "Toy", "toy.md", "toy_reproduction", "A toy.", {"reduced": 1, "full": 2})


@pytest.mark.parametrize("entry", REPRODUCTIONS, ids=lambda e: e.name)
def test_every_entry_is_a_command_that_states_its_duration(entry):
    res = runner.invoke(app, ["reproduce", entry.name, "--help"], terminal_width=200)
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "Takes about" in text and "of CPU" in text
    for opt in entry.options:
        assert opt.flag in res.output


def test_bad_engine_options_fail_in_one_line_before_any_work(tmp_path):
    res = runner.invoke(app, ["reproduce", "multibin-engine", "--ks", "1,x", "--out", str(tmp_path)])
    assert res.exit_code == 2 and res.stderr.strip() == "error: --ks must be comma-separated integers, got '1,x'"
    res = runner.invoke(app, ["reproduce", "multibin-engine", "--ks", "1,64", "--num-requests", "8",
                              "--out", str(tmp_path)])
    assert res.exit_code == 2 and "--ks must list bin counts in [1, --num-requests=8]" in res.stderr
    assert not list(tmp_path.iterdir())  # nothing started, nothing written
    res = runner.invoke(app, ["reproduce", "all", "--only", "nope", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "--only: unknown design(s) ['nope']" in res.stderr


def test_reproduce_all_from_a_fresh_folder_writes_under_out_only(tmp_path, monkeypatch):
    monkeypatch.setattr(reproduce_all, "REPRODUCTIONS", (TOY,))
    monkeypatch.chdir(tmp_path)
    committed = REPO_README.read_bytes()
    res = runner.invoke(app, ["reproduce", "all", "--quiet"])
    assert res.exit_code == 0, res.output
    out = tmp_path / "results" / "reproduction"
    assert "wrote results/reproduction/README.md" in res.stdout
    assert (out / "reduced" / "toy.md").is_file() and (out / "README.json").is_file()
    text = (out / "README.md").read_text()
    assert "No full report yet (`toy.md` is missing in" in text  # the committed docs hold no toy report
    assert REPO_README.read_bytes() == committed and not (tmp_path / "docs").exists()


def test_update_docs_with_full_runs_and_readme_only_rebuilds_it(tmp_path, monkeypatch):
    monkeypatch.setattr(reproduce_all, "REPRODUCTIONS", (TOY,))
    docs, out = tmp_path / "docs", tmp_path / "out"
    res = runner.invoke(app, ["reproduce", "all", "--quiet", "--full", "--update-docs", "--docs", str(docs),
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    readme = (docs / "README.md").read_text()
    assert (docs / "toy.md").is_file() and (out / "reduced" / "toy.md").is_file() and not (out / "README.md").exists()
    assert "| total is the sum of squares | 285 | 285 | n=10 | reached | not reached | differ" in readme
    payload = json.loads((docs / "README.json").read_text())
    assert payload["command"].startswith("servelab reproduce all --full --update-docs")
    (docs / "README.md").write_text("stale")
    res = runner.invoke(app, ["reproduce", "all", "--readme-only", "--docs", str(docs)])
    assert res.exit_code == 0 and (docs / "README.md").read_text() == readme
