"""Where servelab looks for the shared data sets by default: ``$SERVELAB_DATA_DIR``, else
``../shared/data`` beside the repository (the layout of a checkout next to its data)."""

from __future__ import annotations

import os
from pathlib import Path


def default_data_dir() -> Path:
    env = os.environ.get("SERVELAB_DATA_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"


def gsm8k_path() -> Path:
    return default_data_dir() / "datasets" / "gsm8k_train.jsonl"
