"""Golden simulations: a fingerprint of every policy and preset's behaviour on small runs.

A refactor or a speed-up must leave every simulated number as it was; a change that is meant
to move them (a new cost model, a fixed policy) rewrites this file and says so in its commit.
Each case runs a small workload under one policy or preset on the default cost model and
records, per case, a SHA-256 over every request's terminal status, reason, instance,
preemptions, transfers and token emission times (rounded to 1 ns), beside a few summary
numbers that show *where* a mismatch is when the hash differs.

    python scripts/golden_simulations.py           # compare with tests/golden/simulations.json
    python scripts/golden_simulations.py --write   # rewrite it (a deliberate behaviour change)

tests/simulator/test_golden.py runs the comparison in the suite (about 20 CPU-s).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "simulations.json"

# (case name, policy or preset spec, instances, workload spec, hardware overrides)
_MIXED = "poisson:rate=40,n=200,prompt=uniform(16,1500),output=uniform(1,300)"
_BURST = "burst:n=80,prompt=uniform(100,2000),output=uniform(20,400)"
CASES: list[tuple[str, str, int, str, dict]] = [
    *[(f"{p}-1", p, 1, _MIXED, {}) for p in
      ("static", "uellm", "vllm", "sarathi", "sjf", "ljf", "priority", "multibin", "bucketserve")],
    ("vllm-2", "vllm", 2, _MIXED, {}),
    ("vllm-tiny-kv", "vllm", 1, _BURST, {"gpu_memory_utilization": 0.4}),
    ("vllm-swap", "vllm:preemption=swap", 1, _BURST, {"gpu_memory_utilization": 0.4, "swap_space_gb": 4.0}),
    ("sarathi-tiny-kv", "sarathi:token_budget=256", 1, _BURST, {"gpu_memory_utilization": 0.4}),
    ("distserve-2", "distserve", 2, _MIXED, {}),
    ("distserve-4", "distserve", 4, _BURST, {}),
    ("bucketserve-pd-2", "bucketserve-pd", 2, _MIXED, {}),
    ("llumnix-2", "llumnix", 2, _BURST, {"gpu_memory_utilization": 0.3}),
    ("infercept-2", "infercept", 2, _BURST, {"gpu_memory_utilization": 0.3}),
    ("vllm-pp-2", "vllm-pp", 2, _MIXED, {}),
    ("multibin-router-2", "multibin", 2, _MIXED, {}),
    ("dynaserve-2", "dynaserve", 2, _MIXED, {}),
    ("alignedserve-4", "alignedserve", 4, _BURST, {}),
    ("kunserve-4", "kunserve", 4, _BURST, {"gpu_memory_utilization": 0.3}),
    ("vllm-azure-conv", "vllm", 2, "azure-conv:window=0-120", {}),
    ("sarathi-azure-code", "sarathi", 1, "azure-code:window=0-60", {}),
    ("vllm-8-azure-conv", "vllm", 8, "azure-conv:window=0-300,rate=40", {}),
    ("sarathi-4-mooncake", "sarathi", 4, "mooncake:window=0-120", {"model": "Llama-3.1-8B"}),
]


def fingerprint(requests) -> str:
    """SHA-256 over what a run decided for every request (order: request id)."""
    h = hashlib.sha256()
    for r in sorted(requests, key=lambda r: r.request_id):
        h.update(f"{r.request_id}|{r.status.value}|{r.finish_reason}|{r.instance_id}|{r.num_preemptions}|"
                 f"{r.num_swaps}|{r.num_transfers}|".encode())
        h.update(",".join(f"{t:.9f}" for t in r.token_times_s).encode())
        h.update(b"\n")
    return h.hexdigest()


def run_case(name: str, policy: str, instances: int, workload: str, hw: dict) -> dict:
    from servelab.api import HardwareChoice, load_workload, run_simulation

    wl = load_workload(workload, seed=0)
    out = run_simulation(wl, policy, HardwareChoice(num_instances=instances, **hw))
    s = out.summary
    return {"sha256": fingerprint(out.result.requests), "completed": s.num_completed, "rejected": s.num_rejected,
            "aborted": s.num_aborted, "makespan_s": round(out.result.makespan_s, 6),
            "ttft_p50_s": round(s.ttft.p50, 6) if s.ttft.p50 == s.ttft.p50 else None,
            "output_tokens": out.result.num_output_tokens}


def run_all(selected: list[str] | None = None) -> dict[str, dict]:
    results = {}
    for name, policy, instances, workload, hw in CASES:
        if selected and name not in selected:
            continue
        results[name] = run_case(name, policy, instances, workload, hw)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the golden file with this code's results")
    parser.add_argument("--case", action="append", help="only this case (repeatable)")
    args = parser.parse_args(argv)
    t0 = time.process_time()
    results = run_all(args.case)
    cpu_s = time.process_time() - t0
    if args.write:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        old = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() and args.case else {}
        GOLDEN.write_text(json.dumps({**old, **results}, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(results)} cases to {GOLDEN.relative_to(ROOT)} ({cpu_s:.1f} CPU-s)")
        return 0
    golden = json.loads(GOLDEN.read_text())
    bad = [n for n, r in results.items() if golden.get(n) != r]
    for name in bad:
        print(f"{name}: golden {golden.get(name)}\n{' ' * len(name)}  now    {results[name]}")
    print(f"{len(results) - len(bad)} of {len(results)} cases identical ({cpu_s:.1f} CPU-s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
