"""KunServe's monitor readings (the paper's Fig. 2 and section 4.4): head-of-line KV demand.

A unit (an instance or a pipeline group) is *throttled* when the KV of its running requests
plus the request at the head of its queue does not fit its KV capacity: the head cannot be
admitted for lack of memory (the standard count of Llumnix [41] that the paper uses, "the
in-processing requests and head-of-line queuing requests"). Requests behind the head wait
for compute as much as for memory; counting all of them (as ``llumnix.excess_blocks`` does
for its migration) makes a compute queue look like throttling, so KunServe dropped on
compute queueing and then stayed pipelined. The need ``R`` is the sum of the units' excess;
restore reads the same demand.

Bytes: a block of a pipeline group holds every layer's KV of ``block_size`` tokens once
(each stage its own layers), so a group's KV bytes are its blocks times the *whole model's*
KV bytes per token. The group's ``kv_bytes_per_token`` (the sum over its members) grows as
members restore their layers before the split, and reading capacity through it counted the
restored members' layers twice (500 -> 566 GB on the 8-GPU cluster).
"""

from __future__ import annotations

from servelab.core.planning import fcfs_key


def head_of_line(view):
    """The queued request vLLM's FCFS admission tries first among those that still need KV
    (None: none). A queued request already holding its KV (a group's request whose exchange
    has not landed, or has landed and waits for a step) waits for no memory: its blocks are
    in the used count already. Taking it as the head counted its KV twice and read a group
    as throttled while its exchange ran (72B: a 7.8K-token transferring head, 490 blocks,
    against 485 free made the second drop, 24 s after the first)."""
    waiting = view.waiting
    if not waiting:
        return None
    holds = view.blocks.is_on_gpu
    return min((r for r in waiting if not holds(r.request_id)), key=fcfs_key, default=None)


def hol_demand_blocks(view) -> int:
    """Blocks the unit's running requests hold plus those its head-of-line request needs."""
    b = view.blocks
    head = head_of_line(view)
    head_blocks = -(-head.num_tokens // b.block_size) if head is not None else 0
    return b.num_used_gpu_blocks + head_blocks


def hol_excess_blocks(view) -> int:
    """Head-of-line demand beyond the unit's KV capacity (> 0: throttled)."""
    return hol_demand_blocks(view) - view.blocks.num_gpu_blocks


def block_bytes(view, whole_kv_bytes_per_token: float) -> float:
    """Bytes of one of the unit's KV blocks (a group's: the whole model's KV per token)."""
    per_token = whole_kv_bytes_per_token if len(view.members) > 1 and whole_kv_bytes_per_token else \
        view.kv_bytes_per_token
    return per_token * view.blocks.block_size


def reading(view) -> dict:
    """The monitor's reading of one unit, as a drop records it."""
    b = view.blocks
    return {"unit": view.instance_id, "members": [i for i, _ in view.members], "used_blocks": b.num_used_gpu_blocks,
            "hol_demand_blocks": hol_demand_blocks(view), "capacity_blocks": b.num_gpu_blocks,
            "num_waiting": len(view.waiting), "num_running": view.num_running}


class GroupStats:
    """Pipeline groups over a run, as the router decided them: when each was formed, began
    restoring (with the demand share that let it) and split; time pipelined in group-seconds
    and instance-seconds (a group of n members counts n)."""

    def __init__(self) -> None:
        self.groups: list[dict] = []
        self._open: dict[int, dict] = {}

    def formed(self, now_s: float, group_id: int, size: int) -> None:
        rec = {"group": group_id, "size": size, "formed_s": now_s, "restore_s": None, "restore_demand_share": None,
               "split_s": None, "restore_checks": 0, "min_demand_share": None, "min_demand_share_s": None}
        self.groups.append(rec)
        self._open[group_id] = rec

    def checked(self, now_s: float, group_id: int, demand_share: float) -> None:
        """A restore check: the group's head-of-line demand over its members' KV without the
        drop (the lowest share seen, and when: restore acts once it is under the threshold)."""
        rec = self._open.get(group_id)
        if rec is not None:
            rec["restore_checks"] += 1
            if rec["min_demand_share"] is None or demand_share < rec["min_demand_share"]:
                rec["min_demand_share"], rec["min_demand_share_s"] = demand_share, now_s

    def restoring(self, now_s: float, group_id: int, demand_share: float) -> None:
        rec = self._open.get(group_id)
        if rec is not None:
            rec["restore_s"], rec["restore_demand_share"] = now_s, demand_share

    def split(self, now_s: float, group_id: int) -> None:
        rec = self._open.pop(group_id, None)
        if rec is not None:
            rec["split_s"] = now_s

    def merged(self, now_s: float, group_id: int, into: int) -> None:
        """A group merged into a larger one (the second drop): its record ends there."""
        rec = self._open.pop(group_id, None)
        if rec is not None:
            rec["merged_s"], rec["merged_into"] = now_s, into

    def report(self, now_s: float) -> dict:
        spans = [((g["split_s"] if g["split_s"] is not None else g.get("merged_s") or max(now_s, g["formed_s"]))
                  - g["formed_s"], g["size"]) for g in self.groups]
        return {"groups_formed": len(self.groups), "groups_split": sum(g["split_s"] is not None for g in self.groups),
                "groups_merged": sum("merged_s" in g for g in self.groups),
                "time_pipelined_group_s": sum(t for t, _ in spans),
                "time_pipelined_instance_s": sum(t * n for t, n in spans), "groups": self.groups}
