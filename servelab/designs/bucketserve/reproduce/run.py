"""``servelab reproduce bucketserve``: BucketServe's figures, its claims at the paper's
operating points, and the experiments that test each gap's stated reason.

The steps run the sweeps (``studies``), the variant studies (prefill mode, the pre-fix policy,
DistServe's own batch caps, the UELLM stand-in's sensitivity), the Mixed long-share
sensitivity, the Fig. 6 breakdown, the bucketing-overhead benchmark (measured), the padding
analysis and, unless ``--no-engine``, the engine measurement of ragged vs padded bucket
prefills (``engine_prefill``, measured, imports torch). ``_write`` makes the plots and
``out_dir/bucketserve.md`` (the whole report, prose included: nothing in it is written by
hand); the runner (``servelab.reproduce``) writes ``out_dir/bucketserve.json``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

import numpy as np

from servelab.core.errors import UserError
from servelab.designs.bucketserve.buckets import BucketingConfig, BucketManager
from servelab.designs.bucketserve.overhead import overhead_grid
from servelab.designs.bucketserve.padding import compare_boundaries
from servelab.designs.bucketserve.reproduce import experiments as ex
from servelab.designs.bucketserve.reproduce import seeds as sd
from servelab.designs.bucketserve.reproduce import studies as st
from servelab.designs.bucketserve.reproduce.engine_prefill import EngineSizes
from servelab.reproduce.runner import Reproduction, Run, Step

# variant studies: (key, system spec, Setting overrides, full online sweep?)
VARIANTS = (
    ("bucketserve_padded", "bucketserve:padded=true", {}, True),
    ("bucketserve_prefix", "bucketserve:padded=true,safe_fraction=0.9,cap_n_max=false", {}, True),
    ("distserve_b4", "distserve:batch=4", {}, True),
    ("distserve_b16", "distserve:batch=16", {}, True),
    ("distserve_server", "distserve:batch=256,prefill_tokens=4096", {}, True),
    ("distserve_padded", "distserve:padded=true", {}, True),
    ("uellm_oracle", "uellm", {"prediction_sigma": 0.0}, False),
    ("uellm_b10", "uellm:batch_size=10", {}, False),
    ("static_b32", "static:batch_size=32", {}, False),
)


@dataclass(frozen=True)
class Sizes:
    offline_requests: int = 1000
    batch_sizes: tuple[int, ...] = (8, 16, 32, 64, 128)
    offline_workloads: tuple[str, ...] = ("alpaca", "longbench", "mixed")
    online_requests: int = 1000
    alpaca_rates: tuple[float, ...] = (4, 8, 12, 16, 20, 24, 28, 32)
    mixed_rates: tuple[float, ...] = (1, 2, 3, 4, 5, 6, 8, 10)
    online_batch: int = 128  # max_num_seqs of every instance online, every system
    long_shares: tuple[float, ...] = (0.1, 0.3, 0.5)
    breakdown_rates: tuple[float, ...] = (4, 8, 16, 32)
    overhead_queued: tuple[int, ...] = (10, 100, 1000, 10_000)
    overhead_buckets: tuple[int, ...] = (1, 4, 16, 64, 256, 1024)
    overhead_repeats: int = 200
    padding_samples: int = 4096
    engine: EngineSizes = EngineSizes()
    seeds: int = 5  # every simulated claim over this many seeds (seed, seed + 1, ...)
    output_means: tuple[float, ...] = (83.0, 270.0)  # Alpaca output mean: the paper's, our generator's
    output_rates: tuple[float, ...] = (8, 16, 32)

    def rates_by_workload(self) -> dict[str, tuple[float, ...]]:
        return {"alpaca": self.alpaca_rates, "mixed": self.mixed_rates}

    def top_rates(self) -> dict[str, float]:
        return {wl: max(r) for wl, r in self.rates_by_workload().items()}


FULL = Sizes()
REDUCED = Sizes(150, (16, 64), ("alpaca", "mixed"), 150, (4, 16, 32), (1, 4, 10), 128, (0.1, 0.3, 0.5), (8, 32),
                (10, 1000), (1, 64, 1024), 30, 512,
                EngineSizes(sim_requests=120, num_batches=3, repeats=1, num_requests=8), 5, (83.0, 270.0), (8, 32))
# every step and claim row on sizes so small the numbers mean nothing (~15 CPU-s without the engine
# step, against ~75 reduced): a check that the command runs (the README check at --fast sizes, the tests)
SMOKE = Sizes(offline_requests=30, batch_sizes=(16,), offline_workloads=("mixed",), online_requests=30,
              alpaca_rates=(4,), mixed_rates=(2,), online_batch=64, long_shares=(0.1, 0.3), breakdown_rates=(8,),
              overhead_queued=(10,), overhead_buckets=(1, 8), overhead_repeats=3, padding_samples=256,
              engine=EngineSizes(preset="tiny", sim_requests=40, num_batches=2, repeats=1, num_requests=4),
              seeds=2, output_means=(83.0, 270.0), output_rates=(4,))


def _setting(run: Run) -> ex.Setting:
    return run.options.get("setting", ex.Setting())


def _start(run: Run) -> None:
    if run.options.get("smoke"):
        run.sizes = SMOKE
    run.results.update({"reduced": run.reduced, "smoke": bool(run.options.get("smoke")), "seed": run.seed,
                        "setting": asdict(_setting(run)), "sizes": asdict(run.sizes)})


def _steps(run: Run) -> list[Step]:
    sizes, seed, setting, res = run.sizes, run.seed, _setting(run), run.results
    seeds = tuple(range(seed, seed + sizes.seeds))

    def online(_: Run) -> None:
        res["online"] = st.online_sweep(sizes.rates_by_workload(), ex.SYSTEMS, sizes.online_requests,
                                        sizes.online_batch, setting, seed)
        res["points"] = {s: st.operating_points(res["offline"], res["online"], s, offline_workload="mixed",
                                                top_batch=max(sizes.batch_sizes), top_rates=sizes.top_rates())
                         for s in ex.SYSTEMS}

    def long_share(_: Run) -> list[dict]:
        others = tuple(x for x in sizes.long_shares if x != setting.long_share)
        rows = st.long_share_study(others, ex.SYSTEMS, sizes, setting, seed, run.say)
        return rows + [{"long_share": setting.long_share, **p} for p in res["points"].values()]

    engine = [Step("engine", lambda _: _engine(sizes, setting, seed, run.say), "engine")] \
        if run.options.get("engine", True) else []
    return [
        Step("offline", lambda _: st.offline_sweep(sizes.offline_workloads, sizes.batch_sizes, ex.SYSTEMS,
                                                   sizes.offline_requests, setting, seed), "offline"),
        Step("online", online),
        Step("variants", lambda _: _variants(sizes, setting, seed), "variants"),
        Step("seeds", lambda _: sd.seed_study(sizes, setting, seeds, run.say), "seeds"),
        Step("output length", lambda _: sd.output_length_study(sizes, setting, seeds, run.say), "output_length"),
        Step("placement", lambda _: sd.placement_study(sizes, setting, seeds, run.say), "placement"),
        Step("long share", long_share, "long_share"),
        Step("breakdown", lambda _: _breakdown(sizes, setting, seed), "breakdown"),
        Step("overhead", lambda _: overhead_grid(sizes.overhead_queued, sizes.overhead_buckets, seed=seed,
                                                 repeats=sizes.overhead_repeats), "overhead"),
        Step("padding", lambda _: _padding(sizes, setting, seed), "padding"),
        *engine,
    ]


def _write(run: Run) -> dict:
    from servelab.designs.bucketserve.reproduce import plots
    from servelab.designs.bucketserve.reproduce.report import write_report

    results, sizes, fig_dir = run.results, run.sizes, run.fig_dir()
    results.setdefault("engine", None)
    files = plots.offline(results["offline"], list(sizes.offline_workloads), fig_dir)
    files += plots.online(results["online"], ["alpaca", "mixed"], fig_dir)
    files += [plots.breakdown(results["breakdown"], fig_dir), plots.overhead(results["overhead"], fig_dir)]
    results["figures"] = [f"{run.stem}/{f}" for f in files]
    write_report(results, run.report_path)
    return results


REPRODUCTION = Reproduction("bucketserve", {"full": FULL, "reduced": REDUCED}, _steps, _write, start=_start,
                            json_name="{stem}.json")


def _variants(sizes: Sizes, setting: ex.Setting, seed: int) -> dict:
    out = {}
    for key, system, overrides, full in VARIANTS:
        s = dataclasses.replace(setting, **overrides)
        out[key] = {"spec": system, "overrides": overrides,
                    **st.variant_study(system, key, sizes, s, seed, offline_workload="mixed", online=full)}
    return out


def _engine(sizes: Sizes, setting: ex.Setting, seed: int, say) -> dict:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise UserError("the engine step of the BucketServe reproduction needs torch; install it or pass --no-engine")
    from servelab.designs.bucketserve.reproduce.engine_prefill import measure  # imports torch

    return measure(sizes.engine, setting, seed, say)


def _breakdown(sizes: Sizes, setting: ex.Setting, seed: int) -> list[dict]:
    rows = []
    for rate in sizes.breakdown_rates:
        workload = ex.online_workload("alpaca", sizes.online_requests, rate, setting, seed)
        r = ex.run("bucketserve", workload, sizes.online_batch, setting)
        transfer = r["transfer_mean_s"]
        rows.append({"client_rps": rate, "prefill_s": r["prefill_phase_mean_s"], "transfer_s": transfer,
                     "decode_s": max(r["decode_phase_mean_s"] - transfer, 0.0),
                     "bucketing_s": r["bucketing_wall_s"] / max(r["num_finished"], 1),  # wall time per request
                     "bucketing_wall_s": r["bucketing_wall_s"], "makespan_s": r["makespan_s"],
                     "num_decisions": r["bucketing"].get("num_decisions", 0),
                     "overhead_frac": r["bucketing_wall_s"] / r["makespan_s"]})
    return rows


def _padding(sizes: Sizes, setting: ex.Setting, seed: int) -> list[dict]:
    """Bisection buckets from a high-load queue vs Eq. 4 and the exact optimum, per workload."""
    rows = []
    for wl in ("alpaca", "longbench", "mixed"):
        rng = np.random.default_rng(seed)
        prompts = ex.length_source(wl, setting).sample(sizes.padding_samples, rng).num_prompt_tokens
        manager = BucketManager(BucketingConfig(4096, min_width=16))
        for key, length in enumerate(prompts[:512].tolist()):
            manager.add(key, min(int(length), 4096), float(key))
        manager.adjust(32)  # a high-load queue: 512 queued, N_max = m = 32
        report = compare_boundaries(prompts, manager.edges(), 4096)
        rows.append({"workload": wl, "mean_prompt": float(prompts.mean()), "p50_prompt": float(np.median(prompts)),
                     "p99_prompt": float(np.quantile(prompts, 0.99)), **asdict(report)})
    return rows
