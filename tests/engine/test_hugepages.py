"""``hugepages``: large CPU tensors advised onto transparent huge pages, or plain where not."""

from __future__ import annotations

import pytest
import torch

from servelab.engine import hugepages


@pytest.fixture
def fresh(monkeypatch):
    """A fresh check of the environment (the module caches its answer)."""
    monkeypatch.setattr(hugepages, "_checked", False)
    yield
    hugepages._checked = False


def test_aligned_tensor_starts_on_a_huge_page_and_holds_its_own_values(fresh):
    if hugepages.why_not() is not None:
        pytest.skip(f"no huge pages here: {hugepages.why_not()}")
    a = hugepages.empty((3, 1 << 20), torch.float32, aligned=True)  # 12 MiB
    b = hugepages.empty((3, 1 << 20), torch.float32, aligned=True)
    assert a.shape == (3, 1 << 20) and a.is_contiguous() and a.data_ptr() % hugepages.HUGE == 0
    a.fill_(1.0), b.fill_(2.0)
    assert a.sum().item() == 3 << 20 and b.sum().item() == 6 << 20


def test_unaligned_large_tensor_is_advised_and_small_ones_are_left_alone(fresh):
    if hugepages.why_not() is not None:
        pytest.skip(f"no huge pages here: {hugepages.why_not()}")
    assert hugepages.advise(torch.empty(8 << 20, dtype=torch.uint8))
    assert not hugepages.advise(torch.empty(1024))  # under two huge pages: nothing to advise
    small = hugepages.empty((4, 4), torch.float32, aligned=True)
    assert small.shape == (4, 4)


def test_switched_off_by_environment_says_why_and_still_allocates(fresh, monkeypatch):
    monkeypatch.setenv("SERVELAB_HUGEPAGES", "0")
    assert hugepages.why_not() == "SERVELAB_HUGEPAGES=0"
    t = hugepages.empty((1 << 21,), torch.float32, aligned=True)
    assert t.shape == (1 << 21,) and not hugepages.advise(t)


def test_kv_cache_on_either_kind_of_page_starts_zeroed():
    from servelab.engine.kv_cache import PagedKVCache  # noqa: PLC0415
    for huge in (True, False):
        cache = PagedKVCache(2, 300, 16, 4, 64, huge_pages=huge)  # 2 x 2 x 300 blocks of 16 KiB: 19 MiB
        assert cache.kv.shape == (2, 2, 300, 16, 4, 64) and cache.kv.is_contiguous()
        assert not cache.kv.any()
