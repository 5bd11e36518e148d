"""The README's commands: every one is found, names a real command, and (the simulator ones)
runs from a fresh folder. ``scripts/check_readme.py --fast`` runs all of them, engine and
server included (docs/readme_check.md)."""

import subprocess
import sys
from pathlib import Path

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


def test_the_simulator_commands_run_from_a_fresh_folder():
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_readme.py"), "--fast", "--quick",
                          "--timeout", "120"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    quick = [c for c in COMMANDS if check_readme.is_quick(c)]
    assert len(quick) >= 5 and f"{len(quick)} of {len(quick)} README commands ok" in res.stdout
