"""A tiny data folder laid out like ``../shared/data`` (same file names, a few rows each).

Workload specs name traces and datasets by source, and the real files take up to a second
to load or tokenise; generated specs run against this folder instead, so hundreds of cases
take seconds. Also holds odd files that ``path=`` values point at: binary, Latin-1, a folder.
"""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import tempfile
from pathlib import Path

AZURE = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
         "2023-11-16 18:15:46.6805900,374,44\n"
         "2023-11-16 18:15:50.9951690,396,109\n"
         "2023-11-16 18:15:51.1301410,879,32\n"
         "2023-11-16 18:15:53.2003280,91,418\n")
MOONCAKE = "".join(json.dumps({"timestamp": t, "input_length": p, "output_length": o, "hash_ids": [i, i + 1]}) + "\n"
                   for i, (t, p, o) in enumerate([(0, 600, 20), (250, 1200, 7), (900, 300, 55), (4000, 80, 3)]))
BURSTGPT = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            "5,ChatGPT,472,18,490,Conversation log\n"
            "45,GPT-4,1087,0,1087,Conversation log\n"
            "118,ChatGPT,417,276,693,API log\n"
            "140,ChatGPT,1360,187,1547,Conversation log\n")
ARXIV = "num_prefill_tokens,num_decode_tokens\n9000,210\n4500,180\n12000,300\n"
GSM8K = "".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in [
    ("Natalia sold clips to 48 of her friends in April. How many in all?", "She sold 48 + 24 = 72 clips.\n#### 72"),
    ("Weng earns $12 an hour for babysitting. How much did she earn?", "12 / 60 = 0.2 per minute.\n#### 10"),
    ("Betty is saving money for a new wallet which costs $100.", "Betty has 100 / 2 = 50.\n#### 5"),
])

FILES = {
    "traces/azure_llm_2023_conv.csv": AZURE,
    "traces/azure_llm_2023_code.csv": AZURE,
    "traces/mooncake_conversation.jsonl": MOONCAKE,
    "traces/burstgpt.csv": BURSTGPT,
    "datasets/arxiv_summarization_lengths.csv": ARXIV,
    "datasets/gsm8k_train.jsonl": GSM8K,
}


@functools.cache
def tiny_data_dir() -> Path:
    """Created once per process; removed when the process ends."""
    root = Path(tempfile.mkdtemp(prefix="servelab-reliability-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "odd").mkdir()
    (root / "odd" / "binary.bin").write_bytes(b"\xff\xfe\x00\x01" + bytes(range(256)))
    latin1 = "TIMESTAMP,ContextTokens,GeneratedTokens\ncaf\xe9,1,2\n".encode("latin-1")
    (root / "odd" / "latin1.csv").write_bytes(latin1)
    (root / "odd" / "empty.csv").write_text("")
    (root / "odd" / "folder").mkdir()
    return root


def odd_paths() -> list[str]:
    """Paths a user might pass by mistake: binary, Latin-1, empty, a folder, nothing there."""
    odd = tiny_data_dir() / "odd"
    return [str(odd / name) for name in ("binary.bin", "latin1.csv", "empty.csv", "folder", "missing.csv")]


def valid_paths() -> list[str]:
    return [str(tiny_data_dir() / name) for name in FILES]
