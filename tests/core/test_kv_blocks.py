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
