"""Generated user input ends in a clean error or a correct result: never a traceback, a
vague message, a hang, a rejected valid input or a silently wrong answer.

The case classes (strategies and judges) live in ``reliability/cases.py`` and, for
``servelab simulate``'s flags, ``reliability/flag_cases.py``;
``scripts/reliability_report.py`` runs the same classes with a fixed seed for
docs/reliability.md.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability.cases import CASE_CLASSES, CLEAN, CORRECT, OTHER, tally
from reliability.flag_cases import FLAG_CASES

EXAMPLES_PER_CLASS = 150
CLASSES = CASE_CLASSES + FLAG_CASES


@pytest.mark.parametrize("case_class", CLASSES, ids=lambda c: c.name)
@settings(max_examples=EXAMPLES_PER_CLASS, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(data=st.data())
def test_generated_input_ends_in_a_clean_error_or_a_correct_result(case_class, data):
    outcome = case_class.run(data.draw(case_class.strategy, label=case_class.name))
    assert outcome.kind != OTHER, outcome.detail


@pytest.mark.parametrize("case_class", CLASSES, ids=lambda c: c.name)
def test_every_class_exercises_both_endings(case_class):
    """A class whose inputs were all rejected (or all accepted) would test half of its rule."""
    counts, others = tally(case_class, 60, random_seed=0)
    assert sum(counts.values()) == 60
    assert counts[CLEAN] >= 5 and counts[CORRECT] >= 5, dict(counts)
    assert not others, others[:3]
