"""docs/benchmarks/vs_vllm.md from the records of ``servelab.bench.vs_vllm`` (no I/O but the text).

Per load: medians over repeats of servelab's client against each server, and the ratios
servelab / vLLM (> 1 means servelab is slower) of the duration and of the CPU seconds the
server's processes spent on the run (robust to other work on a shared machine; vLLM's count
includes its API server, engine core and worker processes). Client agreement: per load and
server, the two clients' medians side by side; they agree when duration and output tok/s are
within ``AGREE_TOLERANCE`` and TTFT/TPOT medians within twice that (TTFT of an all-at-once
load spreads over the whole prefill queue, so its median moves more with prompt order).
Loads with no record here but rows in an earlier report (``vs_vllm_carry``) keep those rows
verbatim; the ``from`` column says, row by row, which commit's runs or report each came from.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

from servelab.bench.vs_vllm import Load, Record
from servelab.bench.vs_vllm_carry import Carried

AGREE_TOLERANCE = 0.10


def _f(x, digits: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{digits}f}"


def medians(records: list[Record]) -> dict[tuple[str, str, str], dict]:
    """(load, client, server) -> {metric: median over repeats, "n": repeats}."""
    groups: dict[tuple[str, str, str], list[Record]] = defaultdict(list)
    for rec in records:
        groups[(rec.key.load, rec.key.client, rec.key.server)].append(rec)
    out = {}
    for key, recs in groups.items():
        m = {name: statistics.median(r.metrics[name] for r in recs) for name in recs[0].metrics
             if all(isinstance(r.metrics.get(name), (int, float)) for r in recs)}
        m["n"] = len(recs)
        m["rate"] = recs[0].rate
        out[key] = m
    return out


def client_agreement(med: dict, load: str, server: str) -> tuple[dict[str, float], bool] | None:
    """Ratios vLLM-client / servelab-client of the medians, and whether they agree."""
    a, b = med.get((load, "servelab", server)), med.get((load, "vllm", server))
    if a is None or b is None:
        return None
    ratios = {k: b[k] / a[k] for k in ("duration", "output_throughput", "median_ttft_ms", "median_tpot_ms")
              if a.get(k) and b.get(k) is not None}
    limits = {"duration": AGREE_TOLERANCE, "output_throughput": AGREE_TOLERANCE,
              "median_ttft_ms": 2 * AGREE_TOLERANCE, "median_tpot_ms": 2 * AGREE_TOLERANCE}
    return ratios, all(abs(r - 1) <= limits[k] for k, r in ratios.items())


def origins(records: list[Record]) -> dict[str, str]:
    """load -> the ``from`` cell of its rows: the commit(s) whose runs they are."""
    commits: dict[str, set[str]] = defaultdict(set)
    for rec in records:
        commits[rec.key.load].add(rec.commit or "commit not recorded")
    return {load: "runs at " + ", ".join(sorted(c)) for load, c in commits.items()}


def _carried(rows: list[tuple[list[str], str]]) -> list[str]:
    return ["| " + " | ".join([*cells, origin]) + " |" for cells, origin in rows]


def _load_rows(loads: tuple[Load, ...], med: dict, origin: dict[str, str], carried: Carried | None) -> list[str]:
    rows = ["| load | rate (req/s) | server | runs | duration (s) | server CPU (s) | output tok/s | "
            "TTFT p50 / p90 / p99 (ms) | TPOT p50 / p90 / p99 (ms) | servelab / vLLM: duration, CPU | from |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for load in loads:
        s, v = med.get((load.name, "servelab", "servelab")), med.get((load.name, "servelab", "vllm"))
        if not s and not v and carried and load.name in carried.load_rows:
            rows += _carried(carried.load_rows[load.name])
            continue
        ratio = s["duration"] / v["duration"] if s and v else None
        cpu_ratio = s["server_cpu_s"] / v["server_cpu_s"] if s and v and "server_cpu_s" in s and "server_cpu_s" in v \
            else None
        ratio_text = ""
        if ratio:
            ratio_text = f"**{ratio:.2f}x**" + (f", {cpu_ratio:.2f}x" if cpu_ratio else "")
        for server, m in (("servelab", s), ("vllm", v)):
            if m is None:
                continue
            rate = "all at once" if math.isinf(m["rate"]) else f"{m['rate']:.3f}"
            rows.append(f"| {load.name} ({load.prompt_tokens}/{load.output_tokens} x {load.num_requests}) | {rate} | "
                        f"{server} | {m['n']} | {_f(m['duration'])} | {_f(m.get('server_cpu_s'))} | "
                        f"{_f(m['output_throughput'])} | "
                        f"{_f(m['median_ttft_ms'], 0)} / {_f(m['p90_ttft_ms'], 0)} / {_f(m['p99_ttft_ms'], 0)} | "
                        f"{_f(m['median_tpot_ms'], 0)} / {_f(m['p90_tpot_ms'], 0)} / {_f(m['p99_tpot_ms'], 0)} | "
                        f"{ratio_text if server == 'servelab' else ''} | {origin.get(load.name, '')} |")
    return rows


def same_work(med: dict, load: str, server: str) -> bool | None:
    """Whether the server spent the same CPU seconds (within ``AGREE_TOLERANCE``) under both
    clients: the two clients sent it the same work, whatever the machine's load did to time."""
    a, b = med.get((load, "servelab", server)), med.get((load, "vllm", server))
    if not a or not b or not a.get("server_cpu_s") or b.get("server_cpu_s") is None:
        return None
    return abs(b["server_cpu_s"] / a["server_cpu_s"] - 1) <= AGREE_TOLERANCE


def _agreement_rows(loads: tuple[Load, ...], med: dict, origin: dict[str, str], carried: Carried | None
                    ) -> tuple[list[str], int, int]:
    rows = ["| load | server | duration s (servelab client / vLLM client) | output tok/s | TTFT p50 ms | TPOT p50 ms "
            "| agree | server CPU s | same work | from |", "|---|---|---:|---:|---:|---:|---|---:|---|---|"]
    agreed = checked = 0
    for load in loads:
        if not any(key[0] == load.name for key in med) and carried and load.name in carried.agree_rows:
            old = carried.agree_rows[load.name]
            rows += _carried(old)
            checked += len(old)
            agreed += sum(cells[6] == "yes" for cells, _ in old)
            continue
        for server in ("servelab", "vllm"):
            res = client_agreement(med, load.name, server)
            if res is None:
                continue
            _, ok = res
            a, b = med[(load.name, "servelab", server)], med[(load.name, "vllm", server)]
            checked += 1
            agreed += ok

            def pair(k, d=1):
                return f"{_f(a[k], d)} / {_f(b[k], d)}"

            work = same_work(med, load.name, server)
            rows.append(f"| {load.name} | {server} | {pair('duration')} | {pair('output_throughput')} | "
                        f"{pair('median_ttft_ms', 0)} | {pair('median_tpot_ms', 0)} | {'yes' if ok else '**no**'} | "
                        f"{pair('server_cpu_s') if work is not None else '-'} | "
                        f"{'-' if work is None else 'yes' if work else '**no**'} | {origin.get(load.name, '')} |")
    return rows, agreed, checked


def render(records: list[Record], loads: tuple[Load, ...], setup: dict, context: dict, command: str,
           carried: Carried | None = None) -> str:
    """The report over ``loads``: from ``records`` where a load has them, else ``carried``'s rows."""
    med = medians(records)
    origin = origins(records)
    ratios, cpu_ratios = {}, {}
    for ld in loads:
        s, v = med.get((ld.name, "servelab", "servelab")), med.get((ld.name, "servelab", "vllm"))
        if s and v:
            ratios[ld.name] = s["duration"] / v["duration"]
            if not ld.poisson and s.get("server_cpu_s") and v.get("server_cpu_s"):
                cpu_ratios[ld.name] = s["server_cpu_s"] / v["server_cpu_s"]
        elif not s and not v and carried and ld.name in carried.ratios:
            ratios[ld.name] = carried.ratios[ld.name]
            if ld.name in carried.cpu_ratios:
                cpu_ratios[ld.name] = carried.cpu_ratios[ld.name]
    carried_loads = [ld.name for ld in loads if carried and ld.name in carried.load_rows
                     and not any(key[0] == ld.name for key in med)]
    loadavg = [x for r in records for x in (r.load_avg_before[0], r.load_avg_after[0])]
    both_servers = (
        f"- Both servers: dtype {setup['dtype']}, {setup['threads']} torch thread(s) (`OMP_NUM_THREADS`), "
        f"KV {setup['kv_gib']:g} GiB (vLLM: `VLLM_CPU_KVCACHE_SPACE`; servelab: `--kv-budget-mb`), max-num-seqs "
        f"{setup['max_num_seqs']}, max-num-batched-tokens {setup['max_num_batched_tokens']}, block size "
        f"{setup['block_size']}, max-model-len {setup['max_model_len']}; vLLM without prefix caching, servelab "
        "`--policy vllm --enable-chunked-prefill` (chunked prefill, decodes first: vLLM v1's schedule).")
    agree_rows, agreed, checked = _agreement_rows(loads, med, origin, carried)
    lines = [
        "# servelab's engine against vLLM's CPU build (measured)",
        "",
        f"Written by `{command}`; rerun it rather than editing this file. Measured on this machine: "
        f"{context.get('machine', '?')}. "
        + (f"Other sessions shared the machine: the 1-minute load average around the runs was "
           f"{min(loadavg):.2f}-{max(loadavg):.2f} (median {statistics.median(loadavg):.2f}; 2 cores), so compare the "
           "ratios, taken from runs interleaved server by server, more than the absolute times." if loadavg else
           "No run of this report's own finished: every row below is carried from an earlier report.")
        + (f" Rows carried from {carried.source} ({', '.join(carried_loads)}; first run as their `from` cell says) "
           "ran at its "
           f"load average {carried.loadavg or '(not stated there)'}, on the engine of that time, with "
           + ("the same server set-up (that report's `Both servers` line equals this one's)."
              if carried.setup_line == both_servers else f"another server set-up: `{carried.setup_line}`.")
           if carried_loads else ""),
        "",
        "## Set-up",
        "",
        f"- Checkpoint: `{setup['checkpoint']}` (servelab make-tiny-model --preset bench-200m: 197M parameters, "
        "16 layers, GQA 16/4, random weights), served by both as `model`.",
        both_servers,
        f"- Versions: {context.get('versions', '?')}.",
        f"- Clients: `servelab bench` (prompts as exact token ids) and vLLM's `vllm bench serve` (random dataset, "
        "`--random-range-ratio 0`), both with EOS ignored so every request produces its output length. "
        f"Poisson loads run at {setup['rate_fraction']:g} x vLLM's capacity on the matching all-at-once load "
        "(requests / duration, first repeat).",
        f"- Repeats: {context.get('repeats', '?')}. Each run is one client sending one load to one server while "
        "the other server idles; the servers alternate which goes first.",
        *([f"- Priority: {context['priority']}."] if context.get("priority") else []),
        *([f"- Carried rows ({carried.source}), as that report said of its runs: "
           + " ".join(ln.removeprefix("- ") for ln in carried.runs_lines)] if carried_loads and carried.runs_lines
          else []),
        "",
        "## Per load (servelab's client; medians over repeats)",
        "",
        *([context["loads_run"], ""] if context.get("loads_run") else []),
        *_load_rows(loads, med, origin, carried),
        "",
    ]
    if ratios:
        worst = max(ratios, key=ratios.get)
        lines += [f"Duration ratio servelab / vLLM: {_f(min(ratios.values()), 2)}x to {_f(max(ratios.values()), 2)}x "
                  f"(worst: {worst}). Targets: within 1.5x on every load{context.get('scope', '')} "
                  f"({'met' if max(ratios.values()) <= 1.5 else 'not met'}), then 1.2x "
                  f"({'met' if max(ratios.values()) <= 1.2 else 'not met'})."]
        if cpu_ratios:
            lines += [f"CPU-seconds ratio servelab / vLLM on the all-at-once loads: {min(cpu_ratios.values()):.2f}x to "
                      f"{max(cpu_ratios.values()):.2f}x (Poisson loads left out: between arrivals vLLM's processes "
                      "keep polling, so its CPU seconds there include idle time)."]
        lines += [""]
    lines += ["## Do the two clients agree?", "",
              f"{agreed} of {checked} (load, server) pairs agree (duration and output tok/s within "
              f"{AGREE_TOLERANCE:.0%}, TTFT and TPOT medians within {2 * AGREE_TOLERANCE:.0%}). The two clients' "
              "runs are separate runs, minutes apart, so on a loaded machine their times also differ by the load; "
              "`same work` compares the CPU seconds the server spent under each client instead (within "
              f"{AGREE_TOLERANCE:.0%}).", "",
              *agree_rows, ""]
    lines += [context.get("notes", ""), ""]
    return "\n".join(lines).rstrip() + "\n"
