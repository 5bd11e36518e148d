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


def test_aligned_tensor_holds_its_own_values_and_starts_on_a_huge_page_where_they_exist(fresh):
    """Both branches: with huge pages (this machine) the tensor starts on one; without (a CI
    kernel with THP off) it is a plain tensor that still holds its values."""
    a = hugepages.empty((3, 1 << 20), torch.float32, aligned=True)  # 12 MiB
    b = hugepages.empty((3, 1 << 20), torch.float32, aligned=True)
    assert a.shape == (3, 1 << 20) and a.is_contiguous()
    if hugepages.why_not() is None:
        assert a.data_ptr() % hugepages.HUGE == 0
    a.fill_(1.0), b.fill_(2.0)
    assert a.sum().item() == 3 << 20 and b.sum().item() == 6 << 20


def test_large_tensors_are_advised_where_huge_pages_exist_and_small_ones_never(fresh):
    assert hugepages.advise(torch.empty(8 << 20, dtype=torch.uint8)) == (hugepages.why_not() is None)
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
