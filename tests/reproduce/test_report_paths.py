"""Report generators name files that exist (issue 31 (13): multibin.md cited
``servelab/analysis/queue_sim.py`` after the module moved, and said the engine run was "not
done" whenever its JSON was not beside the report)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_servelab_path_a_report_generator_cites_exists():
    cited = []
    for source in sorted((ROOT / "servelab" / "designs").glob("*/reproduce/*.py")):
        for path in re.findall(r"`(servelab/[\w/]+\.py)`", source.read_text()):
            cited.append((source.name, path))
    assert cited, "no cited paths found: the pattern no longer matches the generators"
    missing = [(src, path) for src, path in cited if not (ROOT / path).is_file()]
    assert not missing, f"report generators cite missing files: {missing}"


def test_multibin_without_the_engine_json_does_not_claim_the_run_is_not_done():
    from servelab.designs.multibin.reproduce.engine_summary import engine_note, fitted_note

    assert "not done" not in engine_note(None) and "servelab reproduce multibin-engine" in engine_note(None)
    assert "Once our engine exists" not in fitted_note(None)
