"""AlignedServe's quad-tree over prefix lengths and Density First Search (Algorithm 1).

The tree covers prefix lengths [1, max_len]; each internal node splits its range into four
equal sub-ranges and keeps ``(num_requests, num_blocks)`` of its subtree; leaves (ranges of
``leaf_width`` lengths) hold requests. Inserting, removing or growing a request walks one
root-to-leaf path (O(depth) counter updates, no rebuild); nodes are created on first use.

Density First Search builds a batch whose blocks fit ``max_blocks`` and which holds at least
``min_requests`` requests, from requests of similar length:

- case 1: a subtree whose blocks fit and that holds enough requests is the batch;
- case 2: a subtree whose blocks exceed the threshold is narrowed to its densest child
  (the child with the most requests);
- case 3: a subtree that fits but holds too few requests is widened through its left and
  right neighbours (L-Search scans leftwards, R-Search rightwards), always taking the
  neighbour nearer the window's centre, so the batch spans as small a range as possible.

Starvation (Section 3.4): every node keeps a time stamp, the later of when its subtree last
became non-empty and when a batch last took requests from it (a batch refreshes the stamps
on its requests' root-to-leaf paths), and ``oldest``, the earliest stamp of a non-empty node
in its subtree. ``starving`` finds the subtree whose stamp is the oldest once it is older
than the bound; the router cuts the next batch from that subtree (``search(..., start=)``).

Invariant: every node's counters equal the sums over the leaves below it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

_INF = float("inf")


class _Node:
    __slots__ = ("lo", "width", "parent", "index", "children", "items", "num_requests", "num_blocks", "stamp",
                 "oldest")

    def __init__(self, lo: int, width: int, parent: "_Node | None", index: int) -> None:
        self.lo = lo
        self.width = width
        self.parent = parent
        self.index = index  # position among the parent's four children
        self.children: list[_Node | None] | None = None
        self.items: dict[int, tuple[int, int]] | None = None  # leaf: request id -> (length, blocks)
        self.num_requests = 0
        self.num_blocks = 0
        self.stamp = _INF  # when the subtree became non-empty or last generated a batch
        self.oldest = _INF  # the earliest stamp of a non-empty node in this subtree

    @property
    def hi(self) -> int:
        return self.lo + self.width - 1


@dataclass(frozen=True)
class Batch:
    """A Density First Search result: request ids, their blocks, the prefix range and which
    of the three cases produced it (``forced``: fewer than the minimum requests)."""

    request_ids: tuple[int, ...]
    num_blocks: int
    min_len: int
    max_len: int
    case: int
    forced: bool = False


class QuadTree:
    def __init__(self, max_len: int = 65536, leaf_width: int = 16) -> None:
        if max_len < 1 or leaf_width < 1:
            raise ValueError(f"max_len and leaf_width must be >= 1, got {max_len}, {leaf_width}")
        span = leaf_width
        while span < max_len:
            span *= 4
        self.max_len = max_len
        self.leaf_width = leaf_width
        self.root = _Node(1, span, None, 0)
        self._leaf_of: dict[int, _Node] = {}

    def __len__(self) -> int:
        return self.root.num_requests

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._leaf_of

    @property
    def num_blocks(self) -> int:
        return self.root.num_blocks

    def length_of(self, request_id: int) -> int:
        return self._leaf_of[request_id].items[request_id][0]

    def blocks_of(self, request_id: int) -> int:
        return self._leaf_of[request_id].items[request_id][1]

    def in_range(self, lo: int, hi: int, limit: int) -> list[int]:
        """Up to ``limit`` request ids with prefix lengths in [lo, hi] (subtrees outside the
        range are skipped, so the cost is the path plus what is returned)."""
        out: list[int] = []
        stack = [self.root]
        while stack and len(out) < limit:
            n = stack.pop()
            if n.num_requests == 0 or n.hi < lo or n.lo > hi:
                continue
            if n.items is not None:
                out.extend(r for r, (length, _) in n.items.items() if lo <= length <= hi)
            elif n.children is not None:
                stack.extend(c for c in reversed(n.children) if c is not None)
        return out[:limit]

    # ---- incremental updates ----
    def insert(self, request_id: int, length: int, num_blocks: int, now_s: float = 0.0) -> None:
        """Add a request; a subtree that was empty starts its starvation stamp at ``now_s``."""
        if request_id in self._leaf_of:
            raise ValueError(f"request {request_id} is already in the quad-tree")
        length = min(max(int(length), 1), self.max_len)  # longer prefixes count as the maximum
        node = self.root
        while node.width > self.leaf_width:
            if node.num_requests == 0:
                node.stamp = now_s
            node.num_requests += 1
            node.num_blocks += num_blocks
            if node.children is None:
                node.children = [None, None, None, None]
            q = node.width // 4
            k = (length - node.lo) // q
            child = node.children[k]
            if child is None:
                child = node.children[k] = _Node(node.lo + k * q, q, node, k)
            node = child
        if node.num_requests == 0:
            node.stamp = now_s
        node.num_requests += 1
        node.num_blocks += num_blocks
        if node.items is None:
            node.items = OrderedDict()  # a plain dict's iteration slows after many front pops
        node.items[request_id] = (length, num_blocks)
        self._leaf_of[request_id] = node
        self._refresh_oldest(node)

    def remove(self, request_id: int) -> tuple[int, int]:
        """Take a request out; returns its (length, blocks)."""
        leaf = self._leaf_of.pop(request_id)
        length, blocks = leaf.items.pop(request_id)
        node = leaf
        while node is not None:
            node.num_requests -= 1
            node.num_blocks -= blocks
            node = node.parent
        self._refresh_oldest(leaf)
        return length, blocks

    # ---- starvation stamps ----
    def mark_batch(self, request_ids, now_s: float) -> None:
        """A batch takes these requests (call before removing them): every subtree on their
        root-to-leaf paths has just generated a batch."""
        leaves = {id(self._leaf_of[r]): self._leaf_of[r] for r in request_ids if r in self._leaf_of}
        for leaf in leaves.values():
            node = leaf
            while node is not None and node.stamp != now_s:
                node.stamp = now_s
                node = node.parent
        for leaf in leaves.values():
            self._refresh_oldest(leaf)

    @property
    def oldest_stamp(self) -> float:
        """The earliest stamp of any non-empty subtree (inf when the tree is empty)."""
        return self.root.oldest

    def starving(self, now_s: float, bound_s: float) -> "_Node | None":
        """The subtree that has gone longest without generating a batch, if that is at least
        ``bound_s``: descend towards the oldest stamp, stopping at the highest node that holds
        it (the widest subtree that has starved that long)."""
        node = self.root
        if node.num_requests == 0 or now_s < node.oldest + bound_s:
            return None
        while node.stamp != node.oldest and node.children is not None:
            node = min((c for c in node.children if c is not None and c.num_requests), key=lambda c: c.oldest)
        return node

    @staticmethod
    def _refresh_oldest(leaf: _Node) -> None:
        node = leaf
        while node is not None:
            best = node.stamp if node.num_requests else _INF
            for c in node.children or ():
                if c is not None and c.num_requests and c.oldest < best:
                    best = c.oldest
            node.oldest = best
            node = node.parent

    def update(self, request_id: int, length: int, num_blocks: int, now_s: float = 0.0) -> None:
        """A prefix grew: only the counters along the old and new paths change."""
        leaf = self._leaf_of[request_id]
        length = min(max(int(length), 1), self.max_len)
        if leaf.lo <= length <= leaf.hi:
            old = leaf.items[request_id][1]
            leaf.items[request_id] = (length, num_blocks)
            node = leaf
            while node is not None:
                node.num_blocks += num_blocks - old
                node = node.parent
            return
        self.remove(request_id)
        self.insert(request_id, length, num_blocks, now_s)

    # ---- Density First Search ----
    def search(self, max_blocks: int, min_requests: int, *, force: bool = False,
               start: _Node | None = None) -> Batch | None:
        """A batch by Density First Search, or None when no range holds ``min_requests``
        requests within ``max_blocks`` (with ``force``: the best range found regardless).
        ``start``: search from that subtree instead of the root (a starving one)."""
        node = start if start is not None else self.root
        if node.num_requests == 0:
            return None
        while node.num_blocks > max_blocks:  # case 2: too large, narrow to the densest child
            if node.children is None:
                return self._grow(node, max_blocks, min_requests, force, case=2)
            node = max((c for c in node.children if c is not None and c.num_requests),
                       key=lambda c: c.num_requests)
        if node.num_requests >= min_requests:  # case 1
            ids = self._collect(node)
            return self._batch(ids, case=1)
        return self._grow(node, max_blocks, min_requests, force, case=3)

    # ---- pieces ----
    def _grow(self, start: _Node, max_blocks: int, min_requests: int, force: bool, case: int) -> Batch | None:
        """Case 3 (and an over-full leaf): widen a window of leaves around ``start`` through
        the nearer of its left (L-Search) and right (R-Search) neighbours until it holds
        ``min_requests`` or the next neighbour would break ``max_blocks``."""
        ids: list[int] = []
        blocks = 0
        if start.num_blocks <= max_blocks:
            ids = self._collect(start)
            blocks = start.num_blocks
            left, right = self._first_leaf(start, True), self._first_leaf(start, False)
        else:  # one leaf too large on its own (its lengths are within leaf_width): oldest first
            for rid, (_, b) in start.items.items():
                if blocks + b > max_blocks and ids:
                    break
                ids.append(rid)
                blocks += b
            if len(ids) < min_requests and not force:
                return None
            return self._batch(ids, case=case, forced=len(ids) < min_requests)
        centre = (left.lo + right.hi) / 2
        nl, nr = self._neighbour(left, -1), self._neighbour(right, +1)
        while len(ids) < min_requests and (nl is not None or nr is not None):
            take_left = nr is None or (nl is not None and centre - nl.hi <= nr.lo - centre)
            leaf = nl if take_left else nr
            if blocks + leaf.num_blocks > max_blocks:
                for rid, (_, b) in leaf.items.items():  # a part of it, then stop
                    if blocks + b <= max_blocks and len(ids) < min_requests:
                        ids.append(rid)
                        blocks += b
                break
            ids.extend(leaf.items)
            blocks += leaf.num_blocks
            if take_left:
                nl = self._neighbour(leaf, -1)
            else:
                nr = self._neighbour(leaf, +1)
        if len(ids) < min_requests and not force:
            return None
        return self._batch(ids, case=case, forced=len(ids) < min_requests)

    def _batch(self, ids: list[int], *, case: int, forced: bool = False) -> Batch | None:
        if not ids:
            return None
        lengths = [self.length_of(r) for r in ids]
        blocks = sum(self._leaf_of[r].items[r][1] for r in ids)
        return Batch(tuple(ids), blocks, min(lengths), max(lengths), case, forced)

    @staticmethod
    def _collect(node: _Node) -> list[int]:
        out: list[int] = []
        stack = [node]
        while stack:
            n = stack.pop()
            if n.items is not None:
                out.extend(n.items)
            elif n.children is not None:
                stack.extend(c for c in n.children if c is not None and c.num_requests)
        return out

    @staticmethod
    def _first_leaf(node: _Node, leftmost: bool) -> _Node:
        """The leftmost (or rightmost) non-empty leaf below ``node``."""
        while node.children is not None:
            kids = [c for c in node.children if c is not None and c.num_requests]
            node = kids[0] if leftmost else kids[-1]
        return node

    def _neighbour(self, leaf: _Node, direction: int) -> _Node | None:
        """The nearest non-empty leaf left (-1) or right (+1) of ``leaf``: climb until a sibling
        on that side holds requests, then descend to its nearest leaf."""
        node = leaf
        while node.parent is not None:
            sibs = node.parent.children
            rng = range(node.index - 1, -1, -1) if direction < 0 else range(node.index + 1, 4)
            for k in rng:
                s = sibs[k]
                if s is not None and s.num_requests:
                    return self._first_leaf(s, leftmost=direction > 0)
            node = node.parent
        return None
