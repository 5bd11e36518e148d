"""AlignedServe's router parameters (frozen, validated; built from ``name:key=value`` specs)."""

from __future__ import annotations

from dataclasses import dataclass

from servelab.core.errors import UserError

JOIN_RULES = ("paper", "one-for-one", "greedy")


@dataclass(frozen=True)
class AlignedServeConfig:
    """Defaults are the paper's (Section 4.1) where it gives them.

    block_fraction: a batch's KV blocks stay under this share of the decode GPU's blocks
        (Algorithm 1's block threshold, 40%).
    min_batch: Algorithm 1's minimum batch. The paper's evaluation (Section 4.1): "[the block
        threshold] in Algorithm 1 is specifically set to 40% of total GPU blocks, and [the
        request threshold] is set to 36"; Section 3.3's "(e.g., 128)" is an example in the
        description of case 3, so the default is 36 (``min_batch=128`` is a gap-test variant).
        The same number is the scheduler's "batch is too small" trigger (Section 3.2: "the
        running batch is unable to saturate the computing capability ... since the batch is
        too small"), which names no other size.
    max_len / leaf_width: the quad-tree's range of prefix lengths and its leaf width.
    max_wait_s: starvation bound: a request parked this long in the pool is scheduled
        regardless of batching (0 disables, as the paper's Figure 15 does).
    prefetch: GPU-prefetch-for-GPU (candidate batches prefetched over PCIe into the prefill
        GPU, sent over NVLink at schedule time); off, or without NVLink, batches go from the
        pool to the decode GPU over PCIe when scheduled.
    prefix_aware: Density First Search; off, batches are cut from the pool in FCFS order
        (the ablation "w/o B").
    growth_tokens: tokens of growth per running request kept free when requests join a
        decode instance (so a joined request does not force an eviction at once).
    evict_lookahead: decode steps of growth that must fit after an iteration; below that
        the longest request is evicted (case 3).
    requests_buffer: how many pool requests matching the running batch's prefix range may
        wait in the Candidate Requests Buffer (dynamic scheduling).
    idle_force: a decode instance with nothing to run takes the best batch the pool has even
        if it holds fewer than ``min_batch`` requests.
    join: when buffered requests join the running batch. ``paper`` (Algorithm 2's cases 1
        and 2, Section 3.4: "some requests have completed in this iteration, the HBM capacity
        occupied by these completed requests will be released. Accordingly, we try to select
        some requests ... to join the running batch"): after an iteration in which requests
        completed, requests join while the decode GPU's used blocks stay within the batch's
        block threshold (``block_fraction``, the most a batch may hold), and while the running
        batch is under ``min_batch`` as many as blocks allow (an idle instance takes a whole
        batch). ``one-for-one`` (issue 25's first reading): as many join as completed, which
        keeps a decode GPU at the size of the first batch it took (54 rows on 16% of its
        blocks, ShareGPT-like, OPT-6.7B). ``greedy`` (the rule before issue 25): whenever
        blocks are free, so the running batch fills the decode GPU and the pool stays shallow.
    wait_for_kv: the decode instance's next iteration waits for joining KV in flight
        (the preset passes it to the ``alignedserve-decode`` policy; the router counts waits).
    steal: a decode instance left idle with an empty pool takes the ready, unjoined requests of
        another instance's candidate batch. The paper describes one decoding instance's buffers
        and names no binding of a cut batch to an instance; binding one is ours (issue 25's
        offline tail: a batch waited for its busy GPU while others idled). ``steal=false`` keeps
        the binding as a variant.
    """

    block_fraction: float = 0.4
    min_batch: int = 36
    max_len: int = 65536
    leaf_width: int = 16
    max_wait_s: float = 10.0
    prefetch: bool = True
    prefix_aware: bool = True
    growth_tokens: int = 32
    evict_lookahead: int = 4
    requests_buffer: int = 16
    idle_force: bool = True
    join: str = "paper"
    wait_for_kv: bool = True
    steal: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.block_fraction <= 1:
            raise UserError(f"alignedserve: block_fraction must be in (0, 1], got {self.block_fraction}")
        for name in ("min_batch", "max_len", "leaf_width"):
            if getattr(self, name) < 1:
                raise UserError(f"alignedserve: {name} must be >= 1, got {getattr(self, name)}")
        for name in ("growth_tokens", "evict_lookahead", "requests_buffer"):
            if getattr(self, name) < 0:
                raise UserError(f"alignedserve: {name} must be >= 0, got {getattr(self, name)}")
        if self.join not in JOIN_RULES:
            raise UserError(f"alignedserve: join must be one of {', '.join(JOIN_RULES)}, got {self.join!r}")
        if not self.max_wait_s >= 0:
            raise UserError(f"alignedserve: max_wait_s must be >= 0, got {self.max_wait_s}")
