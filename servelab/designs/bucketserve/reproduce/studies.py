"""The sweeps behind the paper's figures, the paper's operating points, and the experiments
that test each stated reason for a gap (all simulated, see ``experiments``).

* ``offline_sweep`` / ``online_sweep``: Fig. 5a-f over batch sizes and client RPS.
* ``operating_points``: each claim read where the paper states it ("under high workloads"):
  offline at the largest batch size of the axis on Mixed (the paper samples both datasets),
  online at the highest client RPS of each axis, capacity at 80% SLO attainment.
* ``variant_study``: a system variant (``experiments`` spec) at those operating points: the
  offline point and a full online sweep per dataset, so its capacity can be read too. Used
  for the prefill mode (ragged vs padded), the pre-fix BucketServe, DistServe with its own
  smaller batch caps, and the UELLM stand-in's sensitivity.
* ``long_share_study``: the verdicts against the share of long requests in Mixed.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from servelab.designs.bucketserve.reproduce import experiments as ex

Say = Callable[[str], None]


def offline_sweep(workloads, batch_sizes, systems, num_requests: int, setting: ex.Setting, seed: int) -> list[dict]:
    rows = []
    for wl in workloads:
        workload = ex.offline_workload(wl, num_requests, setting, seed)
        for bs in batch_sizes:
            for system in systems:
                rows.append({"workload": wl, **ex.run(system, workload, bs, setting)})
    return rows


def online_sweep(rates_by_workload: dict, systems, num_requests: int, batch: int, setting: ex.Setting,
                 seed: int) -> list[dict]:
    rows = []
    for wl, rates in rates_by_workload.items():
        for rate in rates:
            workload = ex.online_workload(wl, num_requests, rate, setting, seed)
            for system in systems:
                rows.append({"workload": wl, "client_rps": rate, **ex.run(system, workload, batch, setting)})
    return rows


def _pick(rows: list[dict], **match) -> dict | None:
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), None)


def capacity(online: list[dict], workload: str, system: str, target: float = 0.8) -> tuple[float | None, bool]:
    """Steady-state server RPS (``experiments.steady_state``) at ``target`` SLO attainment along
    the client-RPS sweep (Fig. 5c-d), and whether it is only a lower bound. Points where the simulator stalled (requests aborted at
    the end of the run, see ``num_stalled``) are left out: their attainment measures the stall,
    not the system; when every point left stays above the target the value is a lower bound."""
    pts = sorted((r["client_rps"], r["steady_rps"], r["slo_attainment"]) for r in online
                 if r["workload"] == workload and r["system"] == system and not r["num_stalled"])
    value = ex.rps_at_attainment([(s, a) for _, s, a in pts], target)
    lower = bool(pts) and all(a >= target for _, _, a in pts)
    return value, lower


def operating_points(offline: list[dict], online: list[dict], system: str, *, offline_workload: str,
                     top_batch: int, top_rates: dict) -> dict:
    """One system's figures at the paper's operating points."""
    off = _pick(offline, workload=offline_workload, batch_size=top_batch, system=system)
    out = {"system": system, "offline_tok_s": off["output_tok_s"] if off else None,
           "offline_busy": off["gpu_busy_frac"] if off else None}
    for wl, rate in top_rates.items():
        on = _pick(online, workload=wl, client_rps=rate, system=system)
        out[f"{wl}_top_server_rps"] = on["steady_rps"] if on else None  # steady state over the arrival window
        out[f"{wl}_top_saturated"] = on["saturated"] if on else None
        out[f"{wl}_top_attainment"] = on["slo_attainment"] if on else None
        out[f"{wl}_top_stalled"] = on["num_stalled"] if on else 0
        out[f"{wl}_capacity_rps"], out[f"{wl}_capacity_lower_bound"] = capacity(online, wl, system)
        out[f"{wl}_top_busy_by_role"] = on["busy_by_role"] if on else {}
    return out


def variant_study(system: str, label: str, sizes, setting: ex.Setting, seed: int, *, offline_workload: str,
                  online: bool = True) -> dict:
    """``system`` at the operating points: the offline point, and online sweeps (or only the
    top rates when ``online`` is False). Its rows are named ``label`` (two variants may share
    a spec and differ in the setting)."""
    top = max(sizes.batch_sizes)
    off = offline_sweep([offline_workload], [top], [system], sizes.offline_requests, setting, seed)
    rates = sizes.rates_by_workload() if online else {wl: (max(r),) for wl, r in sizes.rates_by_workload().items()}
    on = online_sweep(rates, [system], sizes.online_requests, sizes.online_batch, setting, seed)
    for row in off + on:
        row["system"] = label
    point = operating_points(off, on, label, offline_workload=offline_workload, top_batch=top,
                             top_rates=sizes.top_rates())
    return {**point, "online": on}


def long_share_study(shares, systems, sizes, setting: ex.Setting, seed: int, say: Say) -> list[dict]:
    """Mixed at each long share: every system at the operating points (full online sweep)."""
    out = []
    for share in shares:
        s = dataclasses.replace(setting, long_share=share)
        off = offline_sweep(["mixed"], [max(sizes.batch_sizes)], systems, sizes.offline_requests, s, seed)
        on = online_sweep({"mixed": sizes.mixed_rates}, systems, sizes.online_requests, sizes.online_batch, s, seed)
        for system in systems:
            point = operating_points(off, on, system, offline_workload="mixed", top_batch=max(sizes.batch_sizes),
                                     top_rates={"mixed": max(sizes.mixed_rates)})
            out.append({"long_share": share, **point})
        say(f"[bucketserve]   long share {share}: done")
    return out
