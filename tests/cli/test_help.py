"""Every command's --help at 80 columns (issue 31 (10)): no flag name cut ("--gpu-memory-uti…"),
no value shown for a flag ("--json <bool>"), no line wider than the terminal."""

from typer.main import get_command
from typer.testing import CliRunner

from servelab.cli.main import app


def _paths(cmd, path=()):
    if hasattr(cmd, "commands"):  # a group (typer vendors its own click)
        for name, sub in cmd.commands.items():
            yield from _paths(sub, (*path, name))
    yield list(path)


def test_every_help_fits_80_columns_with_whole_flag_names():
    runner, problems = CliRunner(), []
    paths = list(_paths(get_command(app)))
    assert len(paths) > 20
    for path in paths:
        res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
        text = res.output
        if res.exit_code or "…" in text or "<bool>" in text or any(len(line) > 80 for line in text.splitlines()):
            problems.append(" ".join(path) or "servelab")
    assert not problems, f"--help at 80 columns is cut or shows a flag's value: {problems}"
    simulate = runner.invoke(app, ["simulate", "--help"], env={"COLUMNS": "80"}, terminal_width=80).output
    assert "--gpu-memory-utilization <float>" in simulate and "--json " in simulate
    assert "--max-num-batched-tokens, --max-batch-tokens" in simulate


def test_reproduce_listing_is_not_cut_at_an_abbreviation():
    """click takes a command's listing line up to the first full stop: "Figs. 5/11" used to
    leave "DynaServe: ... Figs." and "AlignedServe: Figs." in `servelab reproduce --help`."""
    text = CliRunner().invoke(app, ["reproduce", "--help"], env={"COLUMNS": "80"}, terminal_width=80).output
    listed = [line.strip() for line in text.splitlines() if line.strip().startswith(("dynaserve", "alignedserve", "kunserve"))]
    assert len(listed) == 3 and not any(line.endswith("Figs.") for line in listed), listed
