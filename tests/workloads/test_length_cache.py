"""GSM8K's trained-tokenizer counts are cached per machine and are the counts a fresh training gives."""

from __future__ import annotations

import json

import numpy as np
import pytest

from servelab.workloads import length_cache
from servelab.workloads.datasets import load_gsm8k


def _gsm8k(path, rows):
    path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in rows))
    return path


ROWS = [("How many apples are left if Tom eats two of five?", "He has 5 - 2 = 3 apples left. #### 3"),
        ("What is six times seven?", "Six times seven is 42. #### 42"),
        ("A train goes 60 miles an hour for 3 hours. How far?", "60 * 3 = 180 miles. #### 180")]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVELAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SERVELAB_LENGTH_CACHE", raising=False)
    return tmp_path / "cache"


def _uncached(path, monkeypatch):
    monkeypatch.setenv("SERVELAB_LENGTH_CACHE", "0")
    table = load_gsm8k(path)
    monkeypatch.delenv("SERVELAB_LENGTH_CACHE")
    return table


def test_cold_and_warm_loads_equal_a_fresh_training(cache, tmp_path, monkeypatch):
    path = _gsm8k(tmp_path / "g.jsonl", ROWS)
    fresh = _uncached(path, monkeypatch)
    cold = load_gsm8k(path)
    assert len(list(cache.glob("lengths-gsm8k-*.json"))) == 1
    warm = load_gsm8k(path)
    for table in (cold, warm):
        assert np.array_equal(table.num_prompt_tokens, fresh.num_prompt_tokens)
        assert np.array_equal(table.num_output_tokens, fresh.num_output_tokens)
        assert table.prompt_texts == fresh.prompt_texts


def test_an_edited_file_gets_its_own_counts(cache, tmp_path, monkeypatch):
    path = _gsm8k(tmp_path / "g.jsonl", ROWS)
    load_gsm8k(path)
    _gsm8k(path, ROWS[:2] + [(ROWS[2][0] + " Answer in miles.", ROWS[2][1])])
    assert np.array_equal(load_gsm8k(path).num_prompt_tokens, _uncached(path, monkeypatch).num_prompt_tokens)
    assert len(list(cache.glob("lengths-gsm8k-*.json"))) == 2


def test_a_corrupt_or_unwritable_cache_still_gives_the_counts(cache, tmp_path, monkeypatch):
    path = _gsm8k(tmp_path / "g.jsonl", ROWS)
    expected = _uncached(path, monkeypatch).num_output_tokens
    load_gsm8k(path)
    (cached,) = cache.glob("lengths-gsm8k-*.json")
    cached.write_text('{"prompt": [1, 2')  # truncated by a crash
    assert np.array_equal(load_gsm8k(path).num_output_tokens, expected)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("SERVELAB_CACHE_DIR", str(blocker / "sub"))  # cannot be created
    assert np.array_equal(load_gsm8k(path).num_output_tokens, expected)


def test_the_key_follows_the_file_and_the_label(tmp_path):
    a = _gsm8k(tmp_path / "a.jsonl", ROWS)
    b = _gsm8k(tmp_path / "b.jsonl", ROWS[:2])
    assert length_cache._key(a, "x") != length_cache._key(b, "x")
    assert length_cache._key(a, "x") != length_cache._key(a, "y")
    assert length_cache._key(a, "x") == length_cache._key(a, "x")
