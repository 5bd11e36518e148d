"""Data files parsed once per process: traces and length tables, keyed by the file's identity.

Why: one reproduction builds hundreds of workloads from the same file (a capacity search draws
a workload per rate and seed). Parsing the Azure CSV took about 1 CPU-s each time, 75% of the
DynaServe hand-off gap step's CPU; a GSM8K table trains its BPE tokenizer and tokenises 7,473
rows, about 3 CPU-s, for every ``gsm8k`` spec. Each file is now parsed once per process.

What makes a hit safe:

* The key is the loader and its options plus the file's resolved path, size and modification
  time (ns): a file edited or replaced in place is parsed again. A path that cannot be stat'ed
  is not cached, so the loader raises its own one-line error, and a file that fails to parse
  leaves nothing behind (it raises again on the next call).
* What is kept cannot be changed by a caller: a trace is a tuple of frozen ``RequestSpec``
  and every call gets a new list of them; a length table's arrays are read-only.
* BurstGPT is not cached: its loader warns about zero-token rows, and a cached load would
  warn once only.

At most ``MAX_FILES`` parsed files are kept (least recently used dropped).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Hashable

from servelab.workloads import lengths as ln
from servelab.workloads.datasets import load_arxiv_lengths, load_gsm8k
from servelab.workloads.traces import load_azure_llm, load_mooncake
from servelab.workloads.workload import Workload, length_table

MAX_FILES = 8
_parsed: OrderedDict[tuple, object] = OrderedDict()


def _identity(path: Path) -> tuple | None:
    """(resolved path, size, mtime ns), or None when the path is not a readable regular file."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if not os.path.isfile(path):
        return None
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns)


def _once(kind: Hashable, path: Path, parse: Callable[[], object]) -> object:
    identity = _identity(path)
    if identity is None:
        return parse()
    key = (kind, *identity)
    if key in _parsed:
        _parsed.move_to_end(key)
        return _parsed[key]
    value = parse()
    _parsed[key] = value
    while len(_parsed) > MAX_FILES:
        _parsed.popitem(last=False)
    return value


def _frozen_table(table: ln.LengthTable) -> ln.LengthTable:
    table.num_prompt_tokens.flags.writeable = False
    table.num_output_tokens.flags.writeable = False
    return table


def trace(source: str, path: Path) -> Workload:
    """The Azure (code, conv) or Mooncake trace at ``path``, as a new list each call."""
    loader = load_mooncake if source == "mooncake" else load_azure_llm
    return list(_once(("trace", loader.__name__), path, lambda: tuple(loader(path))))


def trace_lengths(source: str, path: Path) -> ln.LengthTable:
    """The trace's prompt/output pairs as a length table (for ``lengths=azure-conv`` and such)."""
    return _once(("trace lengths", source), path, lambda: _frozen_table(length_table(trace(source, path), source)))


def length_dataset(name: str, path: Path) -> ln.LengthTable:
    """GSM8K (lengths under its own trained tokenizer) or the arXiv lengths at ``path``."""
    loader = load_gsm8k if name == "gsm8k" else load_arxiv_lengths
    return _once(("lengths", loader.__name__), path, lambda: _frozen_table(loader(path)))


def forget() -> None:
    """Drop every parsed file (tests that compare a cold parse with a warm one)."""
    _parsed.clear()
