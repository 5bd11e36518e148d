"""Every policy and preset still decides what it decided when tests/golden/simulations.json was
written (scripts/golden_simulations.py): a refactor or speed-up that moves one simulated token
fails here; a deliberate behaviour change rewrites the file with ``--write`` in its commit."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import golden_simulations  # noqa: E402

GOLDEN = json.loads(golden_simulations.GOLDEN.read_text())


@pytest.mark.parametrize("case", golden_simulations.CASES, ids=[c[0] for c in golden_simulations.CASES])
def test_simulation_matches_golden(case):
    name = case[0]
    assert name in GOLDEN, f"{name} has no golden entry: run python scripts/golden_simulations.py --write"
    assert golden_simulations.run_case(*case) == GOLDEN[name]
