"""The README's commands: every one is found, names a real command, and (the simulator ones)
runs from a fresh folder. ``scripts/check_readme.py --fast`` runs all of them, engine and
server included (docs/readme_check.md)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from typer.testing import CliRunner

from servelab.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import check_readme  # noqa: E402

COMMANDS = check_readme.readme_commands((ROOT / "README.md").read_text())


def test_every_readme_command_names_a_real_command():
    servelab = [c for c in COMMANDS if c.startswith("servelab ")]
    assert len(servelab) >= 15
    runner = CliRunner()
    for command in servelab:
        words = command.split()[1:]
        path = words[:2] if words[0] in ("reproduce", "analyze", "perf") else words[:1]
        res = runner.invoke(app, [*path, "--help"])
        assert res.exit_code == 0, (command, res.output)


def test_fast_sizes_keep_every_command():
    """--fast changes sizes only: each command keeps its name and every option it was given."""
    for command in COMMANDS:
        fast = check_readme.as_run(command, True, Path("/work"))
        assert fast.split()[:2] == command.split()[:2]
        given = {w for w in command.split() if w.startswith("--") and not w.startswith("--[")}
        assert given <= set(fast.split()) | {"--api-key"}, command


@pytest.mark.slow
def test_the_simulator_commands_run_from_a_fresh_folder():
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_readme.py"), "--fast", "--quick",
                          "--timeout", "120"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    quick = [c for c in COMMANDS if check_readme.is_quick(c)]
    assert len(quick) >= 5 and f"{len(quick)} of {len(quick)} README commands ok" in res.stdout
    assert "committed docs/ untouched" in res.stdout
    plots = re.search(r"(\d+) of (\d+) plots with a title", res.stdout)
    assert plots and plots.group(1) == plots.group(2) and int(plots.group(2)) >= 4  # sweep's four at least


REST = [c for c in COMMANDS if not check_readme.is_quick(c)]
CHAINS = check_readme.chains(REST)


def test_the_chains_hold_every_command_once_and_keep_what_shares_state_together():
    assert sorted(c for chain in CHAINS for c in chain) == sorted(REST)
    tiny = next(chain for chain in CHAINS if any("make-tiny-model /tmp/tiny" in c for c in chain))
    assert [c.split()[:2] for c in tiny][:1] == [["servelab", "make-tiny-model"]]  # the writer comes first
    assert any(c.startswith("servelab serve ") for c in tiny) and any("--base-url" in c for c in tiny)
    assert check_readme.chains(["servelab a /tmp/x", "servelab b", "servelab c /tmp/y", "servelab d /tmp/x /tmp/y"]) \
        == [["servelab a /tmp/x", "servelab c /tmp/y", "servelab d /tmp/x /tmp/y"], ["servelab b"]]


@pytest.mark.slow
@pytest.mark.parametrize("chain", range(len(CHAINS)), ids=[chain[0].split(" [")[0][:40] for chain in CHAINS])
def test_every_readme_command_runs_fast_from_a_fresh_folder(chain):
    """The rest of the README at --fast sizes (engine, server, reproductions, reproduce all --only
    multibin), one chain of commands that share files or a server per test, each in its own fresh
    folder, so the suite's workers run them side by side. The QUICK commands ran in the test above;
    the two tests together run every command once (docs/readme_check.md runs all in one go)."""
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_readme.py"), "--fast", "--skip-quick",
                          "--chain", str(chain), "--timeout", "600"], capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    n = len(CHAINS[chain])
    assert f"{n} of {n} README commands ok" in res.stdout and f"(--chain {chain})" in res.stdout
    assert "committed docs/ untouched" in res.stdout


def test_check_readme_flags_plots_without_units_and_missing_outputs(tmp_path):
    import json

    probe = tmp_path / ".plot_probe"
    probe.mkdir()
    figures = [("a.png", "", [{"title": "TTFT p99 vs rate", "xlabel": "rate", "ylabel": "ttft_p99_s"}]),
               ("b.png", "", [{"title": "", "xlabel": "request rate (req/s)", "ylabel": "TPOT (ms)"}]),
               ("c.png", "Fig. 1", [{"title": "", "xlabel": "bins k", "ylabel": "output tokens / s"}])]
    for k, (name, sup, axes) in enumerate(figures):
        (probe / f"{k}.json").write_text(json.dumps({"path": str(tmp_path / name), "suptitle": sup, "texts": [],
                                                     "axes": [{**a, "visible": True} for a in axes]}))
    checks = {c.path: c.problems for c in check_readme.check_plots(probe, tmp_path)}
    assert checks["a.png"] == "x label has no unit (rate); y label is a raw key (ttft_p99_s)"
    assert checks["b.png"] == "no title" and checks["c.png"] == ""
    assert check_readme.stated_paths("wrote results/x/sweep.json, plots and requests/<policy>@<rate>.csv") == \
        ["results/x/sweep.json"]
    (tmp_path / "results").mkdir()
    assert "not there" in check_readme.check_outputs("servelab sweep", "wrote results/x/sweep.json", tmp_path)
