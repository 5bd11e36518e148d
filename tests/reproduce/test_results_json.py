"""A reproduction's results JSON is written compact: indented, the full KunServe run's was
3.1 MB, over the 2 MB a tracked file may have; compact it is 1.6 MB with the same content."""

from __future__ import annotations

import json

import numpy as np

from servelab.reproduce.runner import write_results_json


def test_results_are_compact_and_keep_numpy_values(tmp_path):
    data = {"runs": [{"ttft_s": np.float64(0.25), "tokens": np.int64(7), "cdf": np.arange(3)}] * 50}
    path = tmp_path / "r.json"
    write_results_json(path, data)
    text = path.read_text()
    assert "\n" not in text and ", " not in text
    assert json.loads(text)["runs"][0] == {"ttft_s": 0.25, "tokens": 7, "cdf": [0, 1, 2]}
    assert len(text) < len(json.dumps(json.loads(text), indent=1))
