"""``native_build``: a shared header next to a C source is part of the source's build tag."""

from __future__ import annotations

from servelab.core.native_build import _local_includes


def test_an_edited_local_header_changes_what_the_tag_hashes(tmp_path):
    (tmp_path / "shared.h").write_text("static inline int f(void) { return 1; }\n")
    source = tmp_path / "kernel.c"
    source.write_text('#include <stdint.h>\n#include "shared.h"\nint g(void) { return f(); }\n')
    before = _local_includes(source)
    assert b"return 1" in before and b"stdint" not in before  # system headers are not read
    (tmp_path / "shared.h").write_text("static inline int f(void) { return 2; }\n")
    assert _local_includes(source) != before


def test_the_engine_kernels_hash_their_shared_exp8_header():
    from pathlib import Path

    import servelab.engine as engine

    folder = Path(engine.__file__).parent
    for name in ("layer_ops.c", "paged_decode.c"):
        assert b"exp8" in _local_includes(folder / name)
