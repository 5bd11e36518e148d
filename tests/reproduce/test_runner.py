"""The reproduction runner: steps in order with their CPU time, results stored where the step
says, partial results while running and kept on an interrupt (Ctrl-C or SIGTERM), temporary
folders removed however a run ends, variants, seeds, and the ETA from the last run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from servelab.core.errors import UserError
from servelab.reproduce.runner import run_reproduction

sys.path.insert(0, str(Path(__file__).parent))
import toy_reproduction as toy  # noqa: E402


def test_steps_store_time_and_write_the_results(tmp_path):
    lines: list[str] = []
    res = run_reproduction(toy.REPRODUCTION, tmp_path, seed=3, progress=lines.append)
    assert res["rows"]["squares"] == [i * i for i in range(10)] and res["total"] == 285
    assert list(res["timings_cpu_s"]) == ["squares", "total", "seeds"]
    saved = json.loads((tmp_path / "toy.json").read_text())
    assert saved["total"] == 285 and saved["seeds"]["seeds"] == [3, 4]  # default_seeds=2 from seed 3
    assert not (tmp_path / "toy.partial.json").exists()  # a finished run leaves no partial file
    assert not Path(res["tmp_dir"]).exists()  # the run's temporary folder is gone
    assert lines[0].startswith("[toy 1/3] squares (elapsed") and lines[1].startswith("[toy 1/3] squares: ")
    assert "| claim | paper | ours | operating point | verdict | premise |" in (tmp_path / "toy.md").read_text()


def test_a_second_run_gives_an_eta_from_the_first(tmp_path):
    run_reproduction(toy.REPRODUCTION, tmp_path)
    lines: list[str] = []
    run_reproduction(toy.REPRODUCTION, tmp_path, progress=lines.append)
    assert "ETA ~" in lines[0]
    lines = []
    run_reproduction(toy.REPRODUCTION, tmp_path / "fresh", progress=lines.append, expected_cpu_s=30.0)
    assert "ETA ~30 s" in lines[0]  # no earlier run there: the registry's total


def test_an_interrupt_keeps_the_partial_results_and_removes_temporary_folders(tmp_path):
    lines: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        run_reproduction(toy.REPRODUCTION, tmp_path, sizes=toy.Sizes(fail_at="total"), progress=lines.append)
    partial = json.loads((tmp_path / "toy.partial.json").read_text())
    assert partial["interrupted_at"] == "total" and partial["steps_done"] == ["squares"]
    assert partial["results"]["rows"]["squares"][:3] == [0, 1, 4]
    assert not Path(partial["results"]["tmp_dir"]).exists()
    assert "interrupted during total" in lines[-1] and not (tmp_path / "toy.json").exists()


def test_sigterm_cleans_up_like_ctrl_c(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import toy_reproduction as toy
        from servelab.reproduce.runner import run_reproduction
        run_reproduction(toy.REPRODUCTION, {str(tmp_path)!r}, sizes=toy.Sizes(fail_at="sigterm:squares"))
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == 143, res.stderr
    partial = json.loads((tmp_path / "toy.partial.json").read_text())
    assert partial["interrupted_at"] == "squares" and not Path(partial["results"]["tmp_dir"]).exists()


def test_variants_replace_sizes_and_name_their_files(tmp_path):
    res = run_reproduction(toy.REPRODUCTION, tmp_path, variant="small")
    assert res["total"] == 0 + 1 + 4
    assert (tmp_path / "toy-small.md").is_file() and (tmp_path / "toy-small.json").is_file()
    with pytest.raises(UserError, match="no variant 'big'.*known: small"):
        run_reproduction(toy.REPRODUCTION, tmp_path, variant="big")
    with pytest.raises(UserError, match="--seeds must be >= 1"):
        run_reproduction(toy.REPRODUCTION, tmp_path, num_seeds=0)


def test_reduced_sizes_and_seed_count(tmp_path):
    res = run_reproduction(toy.REPRODUCTION, tmp_path, reduced=True, num_seeds=3)
    assert res["rows"]["squares"] == [0, 1, 4, 9] and res["seeds"]["seeds"] == [0, 1, 2]
    assert res["seeds"]["interval"].startswith("1 (95% CI")
