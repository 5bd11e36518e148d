"""Block manager invariants under arbitrary operation sequences (hypothesis state machine)."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from servelab.core.kv_blocks import BlockManager, KVCacheConfig


class BlockMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(KVCacheConfig(block_size=4, num_gpu_blocks=24, num_cpu_blocks=12, watermark=0.0))
        self.tokens: dict[int, int] = {}

    @rule(rid=st.integers(0, 6), n=st.integers(1, 30))
    def allocate(self, rid, n):
        if self.bm.is_swapped(rid):
            with pytest.raises(RuntimeError):
                self.bm.allocate(rid, n)
            return
        if self.bm.can_allocate(rid, n):
            self.bm.allocate(rid, n)
            self.tokens[rid] = self.tokens.get(rid, 0) + n
        else:
            with pytest.raises(MemoryError):
                self.bm.allocate(rid, n)

    @rule(rid=st.integers(0, 6))
    def free(self, rid):
        self.bm.free(rid)
        self.tokens.pop(rid, None)

    @rule(rid=st.integers(0, 6))
    def swap_out(self, rid):
        if self.bm.is_on_gpu(rid) and self.bm.can_swap_out(rid):
            pairs = self.bm.swap_out(rid)
            assert len(pairs) == self.bm.blocks_for(self.tokens[rid])

    @rule(rid=st.integers(0, 6))
    def swap_in(self, rid):
        if self.bm.is_swapped(rid) and self.bm.can_swap_in(rid):
            self.bm.swap_in(rid)

    @invariant()
    def no_block_lost_or_shared(self):
        self.bm.check_invariants()
        for rid, n in self.tokens.items():
            assert self.bm.num_reserved_tokens(rid) == n


TestBlockManager = BlockMachine.TestCase
TestBlockManager.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_watermark_blocks_new_requests_only():
    bm = BlockManager(KVCacheConfig(block_size=1, num_gpu_blocks=100, watermark=0.1))
    bm.allocate(0, 85)
    assert not bm.can_allocate(1, 6, new_request=True)  # 6 + 10 reserved > 15 free
    assert bm.can_allocate(0, 6)  # a running request may dip into the watermark


def test_config_rejects_nonsense():
    with pytest.raises(ValueError, match="block_size"):
        KVCacheConfig(block_size=0)
    with pytest.raises(ValueError, match="watermark"):
        KVCacheConfig(watermark=1.5)


@pytest.mark.parametrize("count", [1, 3])
def test_extend_tables_takes_the_blocks_append_blocks_would(count):
    """The decode group appends through the live tables it keeps (``gpu_table``), skipping the
    lookup by id (issue 29): the same block ids, in the same order, as ``append_blocks`` per request."""
    config = KVCacheConfig(block_size=4, num_gpu_blocks=40, num_cpu_blocks=0, watermark=0.0)
    by_id, by_table = BlockManager(config), BlockManager(config)
    for bm in (by_id, by_table):
        for rid in (7, 3, 9):
            bm.allocate(rid, 5)
    tables = {rid: by_table.gpu_table(rid) for rid in (9, 7, 3)}
    by_table.extend_tables(tables, count)
    for rid in (9, 7, 3):
        by_id.append_blocks(rid, count)
    for rid in (9, 7, 3):
        assert by_table.block_table(rid) == by_id.block_table(rid)
        assert by_table.gpu_table(rid) is tables[rid]  # still the live table
    assert by_table.num_free_gpu_blocks == by_id.num_free_gpu_blocks
    by_table.free(7)
    by_id.free(7)
    assert by_table.allocate(5, 4) == by_id.allocate(5, 4)  # the free lists are in the same order


def test_extend_tables_names_the_request_that_runs_short():
    for count, message in ((1, "request 2: needs 1 KV block, 0 free"), (2, "request 1: needs 2 KV blocks, 1 free")):
        bm = BlockManager(KVCacheConfig(block_size=4, num_gpu_blocks=3, num_cpu_blocks=0, watermark=0.0))
        bm.allocate(1, 4)
        bm.allocate(2, 4)
        with pytest.raises(MemoryError, match=message):
            bm.extend_tables({1: bm.gpu_table(1), 2: bm.gpu_table(2)}, count)


def test_block_ids_are_shared_objects_in_free_list_order():
    """Every block manager hands out the same int objects (a cache-resident pool at 1,024
    instances), in the order ``range`` gave before, and a grown manager takes fresh ids the same way."""
    a = BlockManager(KVCacheConfig(block_size=4, num_gpu_blocks=600, num_cpu_blocks=300))
    b = BlockManager(KVCacheConfig(block_size=4, num_gpu_blocks=900))
    assert a._free_gpu == list(range(599, -1, -1)) and a._free_cpu == list(range(299, -1, -1))
    assert all(x is y for x, y in zip(reversed(a._free_gpu), reversed(b._free_gpu)))
    a.resize(700)
    assert sorted(a._free_gpu) == list(range(700)) and a.num_free_gpu_blocks == 700
    assert all(x is y for x, y in zip(sorted(a._free_gpu), sorted(b._free_gpu)))
    a.allocate(1, 4 * 650)
    a.check_invariants()
