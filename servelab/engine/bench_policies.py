"""Policies on the real engine vs the simulator's prediction for the same machine.

``servelab perf engine-policies --model DIR --cost-model FILE.json --workload gsm8k:n=64``
tokenises the workload's prompt text with the checkpoint's tokenizer, then runs every policy
twice on identical requests: on the real engine (measured wall clock; each request generates
exactly its dataset output length, EOS ignored, so the work matches the simulator's), and in
the simulator with the calibrated ``LinearCostModel`` of this machine. It prints output
tokens/s for both and each policy's throughput ratio to the first policy.

The simulator sizes KV from its hardware catalog (``--sim-gpu`` / ``--sim-model``), not from
the engine's byte budget, so the engine budget is chosen large enough that KV never binds
either run (checked: the engine reports its peak KV use); limits (max_num_seqs,
max_batch_tokens, block size) are the same in both.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from servelab.core.request import RequestSpec

DEFAULT_POLICIES = ("static:batch_size=8", "multibin:batch_size=8,num_bins=4,lmax=400", "bucketserve", "vllm")


def tokenized_workload(spec: str, tokenizer, data_dir: Path, seed: int, max_output: int | None) -> list[RequestSpec]:
    from servelab.workloads.spec import parse_workload

    out = []
    for s in parse_workload(spec, data_dir, seed):
        if s.prompt_text is None:
            raise ValueError(f"workload {spec!r} has no prompt text; use gsm8k")
        ids = tuple(tokenizer.encode(s.prompt_text).ids)
        num_out = min(s.num_output_tokens, max_output) if max_output else s.num_output_tokens
        out.append(replace(s, num_prompt_tokens=len(ids), prompt_token_ids=ids, num_output_tokens=num_out))
    return out


def run_engine(loaded, policy: str, specs: list[RequestSpec], kv_budget_bytes: int, max_num_seqs: int,
               max_batch_tokens: int) -> dict:
    from servelab.engine.sampling import SamplingParams
    from servelab.engine.serve_loop import EngineConfig, EngineInstance

    config = EngineConfig(kv_budget_bytes=kv_budget_bytes, max_batch_tokens=max_batch_tokens, max_num_seqs=max_num_seqs)
    engine = EngineInstance(loaded, policy, config)
    params = {s.request_id: SamplingParams(temperature=0.0, max_tokens=s.num_output_tokens, ignore_eos=True)
              for s in specs}
    res = engine.run(specs, params)
    s = res.summary
    return {"tok_s": s.output_tokens_per_s, "duration_s": s.duration_s, "completed": s.num_completed,
            "padding_waste": s.padding_waste, "kv_max": s.kv_utilization_max, "steps": res.collector.num_steps,
            "blocks_free_after": res.num_used_blocks_after == 0}


def run_sim(policy: str, specs: list[RequestSpec], cost, args) -> dict:
    from servelab.api import HardwareChoice, run_simulation

    hw = HardwareChoice(gpu=args.sim_gpu, model=args.sim_model, max_num_seqs=args.max_num_seqs,
                        max_batch_tokens=args.max_batch_tokens)
    out = run_simulation(specs, policy, hw, cost_model=cost)
    s = out.summary
    return {"tok_s": s.output_tokens_per_s, "duration_s": s.duration_s, "completed": s.num_completed,
            "padding_waste": s.padding_waste, "steps": out.result.collector.num_steps}


def run(args) -> None:
    """The benchmark; ``args`` carries the ``servelab perf engine-policies`` options."""
    from servelab.api import DEFAULT_DATA_DIR
    from servelab.costmodel.linear import LinearCostModel
    from servelab.engine.loader import load_checkpoint

    torch.set_num_threads(args.threads)
    loaded = load_checkpoint(args.model, dtype="float32")
    cost = LinearCostModel.load(args.cost_model)
    specs = tokenized_workload(args.workload, loaded.tokenizer, DEFAULT_DATA_DIR, args.seed, args.max_output)
    rows = []
    for policy in args.policies:
        real = run_engine(loaded, policy, specs, int(args.kv_budget_mb * 2**20), args.max_num_seqs,
                          args.max_batch_tokens)
        sim = run_sim(policy, specs, cost, args)
        rows.append({"policy": policy, "engine": real, "sim": sim})
        if not args.json:
            print(f"{policy:<45} engine {real['tok_s']:8.1f} tok/s ({real['duration_s']:6.1f} s, waste "
                  f"{real['padding_waste']:.0%}, kv max {real['kv_max']:.0%})   simulated {sim['tok_s']:8.1f} tok/s "
                  f"({sim['duration_s']:6.1f} s)", flush=True)
    base = rows[0]
    for r in rows:
        r["engine_ratio"] = r["engine"]["tok_s"] / base["engine"]["tok_s"]
        r["sim_ratio"] = r["sim"]["tok_s"] / base["sim"]["tok_s"]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"\nthroughput relative to {base['policy']}: policy | engine (measured) | simulator (calibrated)")
    for r in rows:
        print(f"  {r['policy']:<45} {r['engine_ratio']:6.2f}x   {r['sim_ratio']:6.2f}x")

