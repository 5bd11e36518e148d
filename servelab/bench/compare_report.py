"""Markdown for ``servelab serve-vs-sim``: measured (bench against serve) next to simulated
(calibrated cost model), and where the client's TTFT goes. Every number comes from the
payload ``compare.run_compare`` returned; the text around them says how they were made.
"""

from __future__ import annotations

import os
import platform


def _f(x, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:,.{digits}f}"


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    load = ", load average {:.1f} when the report was written (other work shares the cores)".format(
        os.getloadavg()[0]) if hasattr(os, "getloadavg") else ""
    return f"{cpu}, {os.cpu_count()} cores visible, {platform.system()} {platform.release()}{load}"


def render(payload: dict, command: str, model_note: str, cost_note: str | None = None) -> str:
    """``model_note`` and ``cost_note`` describe the checkpoint and the cost model of this run
    (read from their files), so the page never claims a preset or a command the run did not use."""
    o, rows = payload["options"], payload["rows"]
    lines = [
        "# Serving: `servelab bench` against `servelab serve`, next to the simulator",
        "",
        f"Written by `{command}`; do not edit by hand.",
        "",
        f"- **Measured** on this machine ({_machine()}): `servelab serve` (one process, policy `{o['policy']}`, "
        f"{o['num_instances']} instance(s), {o['threads']} torch thread(s), KV {o['kv_budget_mb']:g} MiB per instance, "
        f"block {o['block_size']}, max {o['max_num_seqs']} seqs / {o['max_num_batched_tokens']} batched tokens) "
        f"loaded by `servelab bench` from another process on the same machine (HTTP over loopback).",
        f"- **Model**: {model_note}; **cost model**: {cost_note or '`' + str(o['cost_model']) + '`'}.",
        f"- **Simulated**: `servelab`'s simulator on the same requests (arrival times, the server's prompt token "
        f"counts, output lengths), same policy, instance count and batch limits, with that calibrated linear "
        f"cost model. The simulator's KV capacity "
        f"comes from its hardware catalog, not the engine's KV budget; the *preemptions* column shows whether KV "
        f"ever ran short on either side (when both are 0, the capacity difference did not matter).",
        f"- **Workload**: `{o['workload']}`, Poisson-like arrivals (gamma, burstiness {o['burstiness']:g}) at each "
        f"rate, seed {o['seed']}; output lengths forced with `max_tokens` + `ignore_eos`; prompts of exactly the "
        f"planned token count (the server's tokenizer).",
        "",
        "## Latency and throughput, measured vs simulated",
        "",
        "| rate (req/s) | done | out tok/s meas. | out tok/s sim. | TTFT p50 meas. / sim. (ms) | TTFT p90 | "
        "TTFT p99 | TPOT p50 meas. / sim. (ms) | TPOT p90 | TPOT p99 | preemptions meas. / sim. |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        b, s = r["bench"], r["sim"]
        lines.append(
            f"| {r['rate']:g} | {r['completed']}/{r['num_requests']} | {_f(b['output_throughput'])} | "
            f"{_f(s['output_throughput'])} | {_f(b['median_ttft_ms'])} / {_f(s['median_ttft_ms'])} | "
            f"{_f(b['p90_ttft_ms'])} / {_f(s['p90_ttft_ms'])} | {_f(b['p99_ttft_ms'])} / {_f(s['p99_ttft_ms'])} | "
            f"{_f(b['median_tpot_ms'])} / {_f(s['median_tpot_ms'])} | {_f(b['p90_tpot_ms'])} / {_f(s['p90_tpot_ms'])} | "
            f"{_f(b['p99_tpot_ms'])} / {_f(s['p99_tpot_ms'])} | "
            f"{_f(r['preemptions']['measured'], 0)} / {r['preemptions']['sim']} |")
    lines += [
        "",
        "TPOT is (e2e - TTFT) / (output tokens - 1) per request, as `vllm bench serve` defines it, on both sides; "
        "measured TTFT and TPOT are the client's (they include HTTP).",
        "",
        "## HTTP overhead: where the client's TTFT goes",
        "",
        "Timestamps from the client and the server's request log on one clock (`time.perf_counter`, the "
        "machine's monotonic clock, shared by both processes), medians over the requests of each rate (p90 in "
        "brackets), in ms. *client to server*: request sent to the handler receiving it (connection, HTTP, "
        "JSON and pydantic validation); *server to engine*: handler to the scheduler loop taking the request "
        "(tokenising, and waiting while a step runs: the loop reads its inbox between steps); *engine TTFT*: "
        "the engine's own (arrival to first token, queueing and prefill); *engine to client*: first token to the "
        "client reading its chunk (event-loop hop, SSE, parsing).",
        "",
        "| rate | client TTFT | engine TTFT | overhead (client - engine) | client to server | server to engine "
        "| engine to client | TPOT p50 client / engine |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        sp = r["ttft_split_ms"]

        def cell(name: str) -> str:
            return f"{_f(sp[name]['median'], 2)} ({_f(sp[name]['p90'], 2)})"

        overhead = None
        if sp["client_ttft"]["median"] is not None and sp["engine_ttft"]["median"] is not None:
            overhead = sp["client_ttft"]["median"] - sp["engine_ttft"]["median"]
        lines.append(f"| {r['rate']:g} | {cell('client_ttft')} | {cell('engine_ttft')} | {_f(overhead, 2)} | "
                     f"{cell('client_to_server')} | {cell('server_to_engine')} | {cell('engine_to_client')} | "
                     f"{_f(r['bench']['median_tpot_ms'])} / {_f(r['engine']['median_tpot_ms'])} |")
    lines += [
        "",
        "## Did the steps get a whole core?",
        "",
        "The server's CPU seconds over the benchmark (`process_cpu_seconds_total`, every thread: steps, HTTP, "
        "tokenising) against the wall time its instances spent in steps (`servelab:engine_busy_seconds`). With "
        "one torch thread and a core to itself the ratio is about 1 or more; well below 1, other work on the "
        "machine took the core and stretched every measured step, while the calibrated cost model keeps the "
        "step times of its own calibration run.",
        "",
        "| rate | engine busy (s) | server CPU (s) | CPU / busy |",
        "|---:|---:|---:|---:|",
    ]
    for r in rows:
        busy, cpu = r.get("engine_busy_s"), r.get("server_cpu_s")
        ratio = cpu / busy if busy else None
        lines.append(f"| {r['rate']:g} | {_f(busy)} | {_f(cpu)} | {_f(ratio, 2)} |")
    lines += _reading(rows)
    return "\n".join(lines) + "\n"


def _reading(rows: list[dict]) -> list[str]:
    """Sentences computed from the numbers: which part of the overhead dominates, per rate."""
    out = ["", "## Reading", ""]
    for r in rows:
        sp = r["ttft_split_ms"]
        parts = {k: sp[k]["median"] for k in ("client_to_server", "server_to_engine", "engine_to_client")
                 if sp[k]["median"] is not None}
        if not parts:
            continue
        top = max(parts, key=parts.get)
        total = sum(parts.values())
        out.append(f"- {r['rate']:g} req/s: HTTP and hand-over add {total:.2f} ms (median parts summed) to the "
                   f"engine's {_f(sp['engine_ttft']['median'], 2)} ms TTFT; the largest part is "
                   f"*{top.replace('_', ' ')}* ({parts[top]:.2f} ms). "
                   f"Simulated vs measured TTFT p50: {_f(r['sim']['median_ttft_ms'])} vs "
                   f"{_f(r['bench']['median_ttft_ms'])} ms; TPOT p50: {_f(r['sim']['median_tpot_ms'])} vs "
                   f"{_f(r['bench']['median_tpot_ms'])} ms. Simulated requests not finished by length: "
                   f"{r['sim']['unfinished']}.")
    return out
