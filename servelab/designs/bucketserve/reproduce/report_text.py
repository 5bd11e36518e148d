"""The report's prose that does not depend on the numbers: how to run it, where each part of
the design lives, the choices where the paper is silent, and the evidence on the prefill
mode. Kept here so ``report`` stays about numbers; nothing in the report is written by hand.
"""

from __future__ import annotations

CMD = "servelab reproduce bucketserve"


def preamble(results: dict) -> list[str]:
    return [
        "# BucketServe in servelab", "",
        "Paper: Zheng, Xu, Song, Ye, *BucketServe: Bucket-Based Dynamic Batching for Smart and Efficient "
        "LLM Inference Serving* (2025). This whole file is written by the command below; rerun it rather "
        "than editing it.", "",
        "```",
        f"{CMD} --out docs/reproduction            # full sizes: about 10 minutes of CPU (with the engine step)",
        f"{CMD} --reduced --out /tmp/bs           # about 2 minutes",
        "```", "",
        "(or `servelab.reproduce.runner.run_reproduction(REPRODUCTION, out_dir, reduced=..., seed=..., "
        "options={'engine': ...})` with `REPRODUCTION` from `servelab.designs.bucketserve.reproduce.run`). It writes `bucketserve.md`, `bucketserve.json` and the "
        "plots under `bucketserve/` in the output folder. Two runs with the same seed write the same text except "
        "the lines that carry measured times (every such line says *measured* or sits in a section marked "
        "*(measured)*).", "",
        "## Where each part of the design lives", "",
        "| paper | servelab |", "|---|---|",
        "| Request Bucketing Manager, Algorithm 1 | `servelab/designs/bucketserve/buckets.py` (`BucketManager`): "
        "placement by bisection over sorted lower bounds (O(log k); the paper scans linearly), ADJUSTBUCKETS "
        "as Algorithm 1 gives it, one split pass per adjustment (`repeat=true`, the behaviour before issue 32, "
        "repeats the pass until no bucket qualifies: a variant in *The premise on both sides*), one manager per "
        "task class (online, offline) |",
        "| Padding analysis, Eqs. 2-4 | `servelab/designs/bucketserve/padding.py`: `waste_ratio`, `expected_waste`, "
        "`conditional_means` (Eq. 4), `optimal_edges` (exact minimiser by dynamic programming) |",
        "| Dynamic Batching Controller, Eqs. 5, 6 | `servelab/designs/bucketserve/controller.py`: "
        "`safe_memory`, `estimate_n_max` (Eq. 6 on the monitor's mean length, capped by the "
        "rows one batch can run under the step limit), `form_batch` (Eq. 6 in whole KV blocks on the live free "
        "pool, plus the step's row and token limits). Eq. 1 (the KV of a dense batch padded to its longest row) "
        "is not used and not implemented: the KV is paged, so a batch holds each request's own length, which "
        "Eq. 6 sums |",
        "| Global Monitor | `servelab/designs/bucketserve/monitor.py`: memory use, queues, arrival rate, mean "
        "length (feeds N_max), batch latency, splits/merges, Eq. 2 waste of the bucket batches |",
        "| P/D scheduler | `servelab/designs/bucketserve/policy.py` on both instances of a P/D pair with the "
        "`distserve` router: FCFS to the prefill worker with least work, one bucket batch per prefill step "
        "(ragged by default, `padded=true` for a dense padded batch), KV over NVLink to the decode instance, "
        "continuous batching there. In the experiments the decode instance is DistServe's (`vllm` swapping on a "
        "KV shortage), the same for both systems; `decode=own` runs BucketServe's own decode step |",
        "| Bucketing overhead (Fig. 6) | `servelab/designs/bucketserve/overhead.py` (benchmark over queue size x "
        "bucket count) and the harness's timer around the policy's bucketing steps |",
        "| UELLM (the paper's baseline) | `servelab/baselines/uellm.py`: SLO-ODBS over predicted outputs "
        "(sort by a x SLO + b x prediction, greedy groups under a padding budget), run as padded static batches "
        "with the padded KV reserved; its docstring lists where it departs from UELLM |",
        "| Experiments, this report | `servelab/designs/bucketserve/reproduce/`: `experiments.py` (setting, "
        "systems, one run), `studies.py` (sweeps, operating points, variants, long share), `engine_prefill.py` "
        "(engine measurement), `report.py` / `report_text.py`, `plots.py`, `before.py` |",
    ]


def choices(results: dict) -> list[str]:
    s = results["setting"]
    return [
        "", "## Values the paper does not give (our choices, all parameters)", "",
        f"- SLO: TTFT <= {s['ttft_slo_s']} s and mean TPOT <= {s['tpot_slo_s']} s for every online request "
        "(`Setting.ttft_slo_s`, `Setting.tpot_slo_s`).",
        "- Hardware: every system gets the same 4 x A100-40GB as two TP=2 instances (BucketServe and DistServe: "
        "one prefill + one decode instance; UELLM and static: two coupled instances behind a least-loaded "
        "router; *Placement* sweeps the split), the same 10% memory reserve, the same step limit of "
        f"{s['max_batch_tokens']} tokens and the same row cap (the batch size of Fig. 5a offline; 128 online).",
        "- Decode instance (both P/D systems): DistServe's decoding scheduler, continuous batching that swaps "
        "a request out to host memory on a KV shortage and takes swapped requests back before new ones "
        "(DistServe never recomputes on its decode instance); its host pool (256 GB) is large enough that a "
        "swap never falls back to recompute. `preemption=recompute` (vLLM's P/D) and BucketServe's own decode "
        "step are variants.",
        "- Seeds: every simulated claim over consecutive seeds from the run's seed (*over seeds* in the claims "
        "table); the sweeps, variants and long-share tables are the run's seed.",
        "- Prefill mode: ragged (see *Ragged or padded*). Eq. 5's 10% is the instance's reserve (vLLM's "
        "`gpu_memory_utilization=0.9`), counted once (`safe_fraction=1.0`).",
        "- N_max for ADJUSTBUCKETS: Eq. 6 with every S_i set to the monitor's running mean length, capped by the "
        "rows one batch can run under the step limit (`cap_n_max`); m = N_max; theta = 0.5; buckets never split "
        "below 16 tokens wide (`min_width`).",
        "- Online: the bucket holding the longest-waiting request, FCFS inside; offline: the fullest bucket, LJF "
        "inside (`offline_order`, `offline_bucket`); online buckets first.",
        f"- UELLM's profiler: predicted output = true length x exp(N(0, {s['prediction_sigma']})) "
        "(`with_predictions`); UELLM's constants from its released code: a = 1, b = 0.3, padding budget 15,000 "
        "tokens x 1.2; its row cap is the common one (the released code's 10 is a variant below).",
        "- Operating points: offline claims on Mixed at the largest batch size of the axis (the paper: \"under "
        "high workloads\", requests sampled from both datasets); server-RPS claims at the highest client RPS of "
        "each axis (Alpaca: 32, the highest rate the paper names, Fig. 6a; Mixed: 10, past where every ragged "
        "system saturates); capacity at 80% SLO attainment interpolated along the sweep. The sweeps stay in "
        "the plots.",
    ]


def workloads(results: dict) -> list[str]:
    share = results["setting"]["long_share"]
    lines = [
        "", "## Workloads (how each length distribution was built)", "",
        "Synthetic, from `servelab.workloads.lengths` (no Alpaca or LongBench files in the shared data):", "",
        "- **Alpaca-like**: prompt lognormal with mean 83 tokens (sigma 0.6; the paper: Alpaca averages 83), "
        "output lognormal mean 270 (sigma 0.8), both clipped to [1, 2048].",
        "- **LongBench-like**: prompt lognormal with median 7000 (sigma 0.9, the long tail), output lognormal "
        "median 64 (sigma 0.8) clipped to 512, then the prompt is cut so prompt + output <= 4096 (Llama-2's "
        "context), as the paper truncates LongBench to the model.",
        f"- **Mixed**: each request is LongBench-like with probability {share}, else Alpaca-like.", "",
        f"Why {share:.0%} long: the paper gives no share. It calls Mixed \"a long-tail distribution pattern\" "
        "(Fig. 3) and shows it only as a histogram (Fig. 6b, not legible in our copy), so long requests are a "
        f"minority, and a share of {share} keeps the median prompt Alpaca-like while the mean is an order of "
        "magnitude larger (table below): short-heavy buckets that ADJUSTBUCKETS splits, with a tail that "
        "dominates execution time, as Fig. 3a describes. It is a choice, not a measurement, so the verdicts "
        "are rerun at 10%, 30% and 50% (*Sensitivity to the Mixed long share*).", "",
        "| workload | mean prompt | median | p99 |", "|---|---|---|---|",
    ]
    for p in results["padding"]:
        lines.append(f"| {p['workload']} | {p['mean_prompt']:.0f} | {p['p50_prompt']:.0f} | {p['p99_prompt']:.0f} |")
    return lines


def prefill_evidence() -> list[str]:
    return [
        "", "## Ragged or padded: how a bucket prefill is charged", "",
        "BucketServe's bucket batches run on vLLM (Sec. V-A: \"Our serving framework is built on the vLLM "
        "backend\"). Which kernel that is depends on the vLLM version:",
        "",
        "- vLLM up to v0.3 laid prompts out as a `[batch, max_len]` padded tensor (the scheduler counted "
        "`len(seq_lens) * max(seq_lens)` tokens); vllm-project/vllm#3236 (March 2024, v0.4) replaced it with "
        "one flattened 1D batch, and the attention backends since say \"prompt tokens don't contain any "
        "padding\" (vllm-project/vllm#3884). Padded 2D prefill survives only on platforms that need static "
        "shapes (e.g. HPU, vllm-project/vllm#10125).",
        "- The paper is from 2025 and extends vLLM to a disaggregated architecture; any vLLM of that time "
        "prefills ragged. Its Eq. 6 also budgets memory as a sum of each request's own length (paged KV), not "
        "as rows x longest (Eq. 1's dense batch).",
        "",
        "So the faithful charge is ragged, the same kernel and cost DistServe's vLLM prefill gets; that is the "
        "default (`padded=False`). `padded=true` stays as a parameter for engines that do pad (vLLM <= 0.3, "
        "static-shape accelerators) and is run below as a variant. UELLM and static run HuggingFace-style "
        "static batches, which pad prompts, decode steps and the KV cache, so they are charged padded in "
        "compute and in KV (the padded rectangle rows x (longest prompt + longest output) must fit before a "
        "batch starts). The engine measurement below checks that each mode's charge moves with what the "
        "engine pays in that mode.",
    ]


def engine_intro(engine: dict | None) -> list[str]:
    lines = ["", "### Bucket prefills on the real engine (measured)", ""]
    if engine is None:
        return lines + ["Not run in this invocation (`engine=False`)."]
    return lines + [
        f"Our PyTorch engine on this machine's CPU (torch threads 1), random `{engine['preset']}` checkpoint "
        f"({engine['num_params'] / 1e6:.0f}M parameters), measured wall time (median over repeats after a "
        f"warm-up). The batches are BucketServe's own bucket batches from the Mixed online run at "
        f"{engine['rate_rps']:g} RPS (simulated), lengths divided by {engine['scale']} for the CPU; `sim` columns "
        "are the roofline's charge for the unscaled batch on the A100 (simulated), for comparison of the "
        "padded / ragged ratio only.", "",
        "| rows | real tokens | rectangle tokens | Eq. 2 waste | engine ragged s | engine padded s | "
        "padded / ragged (engine) | padded / ragged (sim charge) |", "|---|---|---|---|---|---|---|---|",
    ]


def known_problems(stalls: list[str]) -> list[str]:
    lines = ["", "## Known problems", ""]
    if not stalls:
        return lines + ["None found in this run: every request of every simulated run ended completed."]
    return lines + [
        "Some simulated runs ended with requests still queued (aborted at the end of the run, counted as SLO "
        "failures): " + "; ".join(stalls) + ". At the end of such a run the decode instance holds landed KV "
        "hand-offs it never schedules while the prefill instance waits to reserve room there: a stall in the "
        "cluster layer, not a property of the system under test. Capacities leave those points out (a capacity "
        "that never fell below 80% on the points left is marked as a lower bound), and a top-rate ratio that "
        "involves a stalled run is read at the highest rate where no compared system stalled.",
    ]
