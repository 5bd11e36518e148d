"""Paged KV block manager: GPU blocks, a host (CPU) pool for swapping, a watermark.

Pure bookkeeping, no torch: the simulator uses it to account memory and the engine uses its
block tables to index the real KV tensors, so both see the same ids.

Invariants (property-tested): every block id is in exactly one place, either a free list,
one request's table or (after a shrink) the retired list; a request's table holds exactly
``blocks_for(num_tokens)`` blocks; a request lives on GPU or on host, never both.

Capacity can change at run time (``resize``: layers dropped free weight memory for KV, or
restored): growing adds fresh ids (or returns retired ones), shrinking retires free blocks
and fails when too few are free. Block ids never move, so tables stay valid.
"""

from __future__ import annotations

from dataclasses import dataclass


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


_ID_POOL: list[int] = []  # the int objects 0, 1, 2, ... that every block manager's ids are


def block_ids(first: int, end: int) -> list[int]:
    """Block ids ``end - 1`` down to ``first`` (a free list's order), as int objects shared by
    every block manager of the process. Ids above 256 are objects of their own, and moving an
    id between a free list and a table writes its reference count: with id objects of its
    own per instance (7,609 blocks on an A100-80GB serving Llama-2-7B), 256 instances held
    1.9M of them (60 MB at 32 B each; 1,024 instances 240 MB), and every block a step or a
    release moved touched a cold one. Shared, they are one instance's worth (0.24 MB) and stay
    in the caches. Values are unchanged, so results are too."""
    pool = _ID_POOL
    if end > len(pool):
        pool.extend(range(len(pool), end))
    return pool[first:end][::-1]


@dataclass(frozen=True, slots=True)
class KVCacheConfig:
    block_size: int = 16  # tokens per block
    num_gpu_blocks: int = 1024
    num_cpu_blocks: int = 0  # host-memory pool for swap; 0 disables swapping
    watermark: float = 0.01  # fraction of GPU blocks kept free when admitting new requests

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.num_gpu_blocks < 1:
            raise ValueError(f"num_gpu_blocks must be >= 1, got {self.num_gpu_blocks}")
        if self.num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {self.num_cpu_blocks}")
        if not 0 <= self.watermark < 1:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")


class BlockManager:
    """Owns every KV block id; requests are identified by their integer id. ``__slots__``: the
    fields sit in the object, not in a values array beside it (one cache line fewer a step when
    many instances evict each other's state; issue 29)."""

    __slots__ = ("config", "block_size", "_free_gpu", "_free_cpu", "_gpu_tables", "_cpu_tables", "_num_tokens",
                 "_num_gpu_blocks", "_num_ids", "_retired", "_watermark_blocks")

    def __init__(self, config: KVCacheConfig) -> None:
        self.config = config
        self.block_size = config.block_size
        self._free_gpu: list[int] = block_ids(0, config.num_gpu_blocks)
        self._free_cpu: list[int] = block_ids(0, config.num_cpu_blocks)
        self._gpu_tables: dict[int, list[int]] = {}
        self._cpu_tables: dict[int, list[int]] = {}
        self._num_tokens: dict[int, int] = {}  # tokens whose KV slots are reserved
        self._num_gpu_blocks = config.num_gpu_blocks
        self._num_ids = config.num_gpu_blocks  # ids ever issued: [0, _num_ids)
        self._retired: list[int] = []  # ids taken out of service by a shrink
        self._watermark_blocks = int(config.watermark * config.num_gpu_blocks)

    # ---- queries (policies may call these; they never change state) ----
    @property
    def num_gpu_blocks(self) -> int:
        return self._num_gpu_blocks

    @property
    def num_block_ids(self) -> int:
        """Block ids ever in use (>= num_gpu_blocks after a shrink): the engine's tensor size."""
        return self._num_ids

    @property
    def num_free_gpu_blocks(self) -> int:
        return len(self._free_gpu)

    @property
    def num_free_cpu_blocks(self) -> int:
        return len(self._free_cpu)

    @property
    def num_used_gpu_blocks(self) -> int:
        return self._num_gpu_blocks - len(self._free_gpu)

    @property
    def watermark_blocks(self) -> int:
        return self._watermark_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def num_reserved_tokens(self, request_id: int) -> int:
        return self._num_tokens.get(request_id, 0)

    def num_blocks_needed(self, request_id: int, num_new_tokens: int) -> int:
        """Extra GPU blocks that reserving ``num_new_tokens`` more slots would take."""
        have = self._num_tokens.get(request_id, 0)
        return self.blocks_for(have + num_new_tokens) - self.blocks_for(have)

    def can_allocate(self, request_id: int, num_new_tokens: int, *, new_request: bool = False) -> bool:
        """New requests must leave the watermark free, so running ones can keep growing."""
        need = self.num_blocks_needed(request_id, num_new_tokens)
        reserve = self._watermark_blocks if new_request else 0
        return need + reserve <= len(self._free_gpu)

    def block_table(self, request_id: int) -> list[int]:
        return self._gpu_tables.get(request_id, [])

    def is_on_gpu(self, request_id: int) -> bool:
        return request_id in self._gpu_tables

    def is_swapped(self, request_id: int) -> bool:
        return request_id in self._cpu_tables

    def can_swap_out(self, request_id: int) -> bool:
        return len(self._gpu_tables.get(request_id, ())) <= len(self._free_cpu)

    def can_swap_in(self, request_id: int) -> bool:
        return len(self._cpu_tables.get(request_id, ())) <= len(self._free_gpu)

    def num_swapped_blocks(self, request_id: int) -> int:
        """GPU blocks a swapped-out request takes back when it is swapped in."""
        return len(self._cpu_tables.get(request_id, ()))

    # ---- mutations (only the instance runtime calls these) ----
    def allocate(self, request_id: int, num_new_tokens: int) -> list[int]:
        """Reserve slots for ``num_new_tokens`` more tokens; returns the new block ids."""
        table = self._gpu_tables.get(request_id)
        if table is None:
            if request_id in self._cpu_tables:
                raise RuntimeError(f"request {request_id} is swapped out; swap it in before allocating")
            table = self._gpu_tables[request_id] = []
        total = self._num_tokens.get(request_id, 0) + num_new_tokens
        need = -(-total // self.block_size) - len(table)
        if need <= 0:
            self._num_tokens[request_id] = total
            return []
        free = self._free_gpu
        if need > len(free):
            if not table:
                del self._gpu_tables[request_id]
            raise MemoryError(f"request {request_id}: needs {need} KV blocks, {len(free)} free")
        new = free[-need:]
        del free[-need:]
        table.extend(new)
        self._num_tokens[request_id] = total
        return new

    def ensure_slots(self, request_id: int, num_tokens: int) -> None:
        """Make sure ``num_tokens`` slots are reserved (the decode hot path: usually one more)."""
        have = self._num_tokens.get(request_id, 0)
        if have >= num_tokens:
            return
        if have + 1 == num_tokens and have % self.block_size and request_id in self._gpu_tables:
            self._num_tokens[request_id] = num_tokens
            return
        self.allocate(request_id, num_tokens - have)

    def ensure_decode_slots(self, request_ids: list[int], num_tokens: list[int]) -> None:
        """``ensure_slots`` for a whole decode batch (the simulator's hottest path).

        Raises MemoryError when blocks run out; rows before the failing one keep their slots
        (the caller treats that as a broken plan, not a state to continue from).
        """
        have = self._num_tokens
        bs = self.block_size
        tables = self._gpu_tables
        for rid, n in zip(request_ids, num_tokens):
            h = have.get(rid, 0)
            if h >= n:
                continue
            if h + 1 == n and h % bs and rid in tables:
                have[rid] = n  # room left in the last block: the common case
            else:
                self.ensure_slots(rid, n)

    def append_block(self, request_id: int) -> None:
        """One more block at the end of a request's table, leaving its slot count to the caller
        (the decode group keeps that count itself and sets it with ``set_reserved_tokens``)."""
        free = self._free_gpu
        if not free:
            raise MemoryError(f"request {request_id}: needs 1 KV block, 0 free")
        self._gpu_tables[request_id].append(free.pop())

    def gpu_table(self, request_id: int) -> list[int]:
        """The request's GPU block table itself, not a copy: the decode group keeps it, so a
        step's appends skip the lookup by request id (with tens of instances the tables are cold,
        and that lookup was the simulator's slowest line: docs/benchmarks/scale_diagnosis.md).
        It stays the same list while the request holds GPU blocks (it is only ever extended)."""
        return self._gpu_tables[request_id]

    def extend_tables(self, tables: dict[int, list[int]], count: int) -> None:
        """``append_blocks(rid, count)`` for each (rid, live table) of ``tables``, in order."""
        free = self._free_gpu
        if count == 1:
            m = len(tables)
            if m <= len(free):  # the blocks free.pop() would hand out, taken in one slice
                new = free[-m:] if m else []
                del free[len(free) - m:]
                for table, block in zip(tables.values(), reversed(new)):
                    table.append(block)
                return
            for rid, table in tables.items():
                if not free:
                    raise MemoryError(f"request {rid}: needs 1 KV block, 0 free")
                table.append(free.pop())
            return
        for rid, table in tables.items():
            if count > len(free):
                raise MemoryError(f"request {rid}: needs {count} KV blocks, {len(free)} free")
            table.extend(free[-count:])
            del free[-count:]

    def append_blocks(self, request_id: int, count: int) -> None:
        free = self._free_gpu
        if count > len(free):
            raise MemoryError(f"request {request_id}: needs {count} KV blocks, {len(free)} free")
        self._gpu_tables[request_id].extend(free[-count:])
        del free[-count:]

    def set_reserved_tokens(self, request_id: int, num_tokens: int) -> None:
        """Record the slots a request holds after ``append_block`` calls (its table must fit them)."""
        self._num_tokens[request_id] = num_tokens

    def free(self, request_id: int) -> None:
        """Release every block the request holds, on GPU or host. Unknown ids are a no-op."""
        self._free_gpu.extend(self._gpu_tables.pop(request_id, ()))
        self._free_cpu.extend(self._cpu_tables.pop(request_id, ()))
        self._num_tokens.pop(request_id, None)

    def swap_out(self, request_id: int) -> list[tuple[int, int]]:
        """Move a request's KV to host; returns (gpu_block, cpu_block) copy pairs."""
        table = self._gpu_tables.get(request_id)
        if table is None:
            raise RuntimeError(f"request {request_id} holds no GPU blocks")
        if len(table) > len(self._free_cpu):
            raise MemoryError(f"request {request_id}: needs {len(table)} host blocks, {len(self._free_cpu)} free")
        cpu = [self._free_cpu.pop() for _ in table]
        del self._gpu_tables[request_id]
        self._free_gpu.extend(table)
        self._cpu_tables[request_id] = cpu
        return list(zip(table, cpu))

    def swap_in(self, request_id: int) -> list[tuple[int, int]]:
        """Move a request's KV back to GPU; returns (cpu_block, gpu_block) copy pairs."""
        table = self._cpu_tables.get(request_id)
        if table is None:
            raise RuntimeError(f"request {request_id} is not swapped out")
        if len(table) > len(self._free_gpu):
            raise MemoryError(f"request {request_id}: needs {len(table)} GPU blocks, {len(self._free_gpu)} free")
        gpu = [self._free_gpu.pop() for _ in table]
        del self._cpu_tables[request_id]
        self._free_cpu.extend(table)
        self._gpu_tables[request_id] = gpu
        return list(zip(table, gpu))

    def resize(self, num_gpu_blocks: int) -> None:
        """Grow or shrink GPU capacity to ``num_gpu_blocks``; a shrink retires free blocks only."""
        if num_gpu_blocks < 1:
            raise ValueError(f"num_gpu_blocks must be >= 1, got {num_gpu_blocks}")
        delta = num_gpu_blocks - self._num_gpu_blocks
        if delta < 0:
            if -delta > len(self._free_gpu):
                raise MemoryError(f"cannot shrink KV to {num_gpu_blocks} blocks: {self.num_used_gpu_blocks} in use")
            self._retired.extend(self._free_gpu[:-delta])  # the ids handed out last stay free
            del self._free_gpu[:-delta]
        elif delta > 0:
            back = min(delta, len(self._retired))
            fresh = block_ids(self._num_ids, self._num_ids + delta - back)
            self._num_ids += delta - back
            self._free_gpu[:0] = fresh + self._retired[len(self._retired) - back:]
            del self._retired[len(self._retired) - back:]
        self._num_gpu_blocks = num_gpu_blocks
        self._watermark_blocks = int(self.config.watermark * num_gpu_blocks)

    def check_invariants(self) -> None:
        """Raise AssertionError if any block is lost or owned twice (tests call this)."""
        for free, tables, total, where in (
            (self._free_gpu + self._retired, self._gpu_tables, self._num_ids, "GPU"),
            (self._free_cpu, self._cpu_tables, self.config.num_cpu_blocks, "host"),
        ):
            owned = [b for t in tables.values() for b in t]
            every = free + owned
            assert len(every) == total, f"{where}: {len(every)} blocks accounted, {total} exist"
            assert sorted(every) == list(range(total)), f"{where}: a block is lost or owned twice"
        assert not (self._gpu_tables.keys() & self._cpu_tables.keys()), "a request is on GPU and host at once"
        for rid, n in self._num_tokens.items():
            table = self._gpu_tables.get(rid, self._cpu_tables.get(rid))
            assert table is not None and len(table) == self.blocks_for(n), f"request {rid}: table size mismatch"
