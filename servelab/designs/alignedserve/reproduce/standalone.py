"""Steps of ``servelab reproduce alignedserve`` run alone, at the full run's sizes and seed,
into a partial-results file that ``render --base`` merges with a full run's results.json.

A full run costs about 2,400 CPU-s on this project's 2-core machine; a change that adds or
touches a few steps reruns those only:

    python -m servelab.designs.alignedserve.reproduce.standalone --list
    python -m servelab.designs.alignedserve.reproduce.standalone \\
        --steps "gap tested: Fig. 11 KV size;gap tested: Fig. 14 host link speed" --out part.json

Every step of this reproduction depends on the setting alone (none reads an earlier step's
results), so any subset runs in any order. The file is rewritten after every step, so a run
cut short keeps what it finished.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    from servelab.designs.alignedserve.reproduce.run import FULL, REPRODUCTION, _start, _steps
    from servelab.metrics.plain_json import plain
    from servelab.reproduce.runner import Run, _store, cpu_time_s, json_default

    ap = argparse.ArgumentParser(description="steps of servelab reproduce alignedserve, alone")
    ap.add_argument("--steps", help="step labels separated by ';', run in this order")
    ap.add_argument("--out", type=Path, help="the partial-results file to write")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--list", action="store_true", help="print the step labels and exit")
    a = ap.parse_args(argv)
    run = Run(REPRODUCTION, (a.out or Path(".")).parent, False, a.seed, FULL, {}, 1, None,
              lambda m: print(m, file=sys.stderr, flush=True))
    _start(run)
    known = {st.label: st for st in _steps(run)}
    if a.list:
        print("\n".join(known))
        return 0
    if not a.steps or a.out is None:
        print("standalone: give --steps and --out (or --list)", file=sys.stderr)
        return 2
    wanted = [x.strip() for x in a.steps.split(";") if x.strip()]
    unknown = [x for x in wanted if x not in known]
    if unknown or not wanted:
        print(f"standalone: unknown steps {unknown} (--list shows the known ones)" if unknown
              else "standalone: --steps names no step", file=sys.stderr)
        return 2
    done, timings, out = [], {}, {}
    load = []
    for label in wanted:
        step = known[label]
        run.say(f"[standalone] {label}")
        t0, load0 = cpu_time_s(), _load()
        value = step.run(run)
        timings[label] = cpu_time_s() - t0
        load.append((load0, _load()))
        if step.key is not None:
            _store(out, step.key, value)
        done.append(label)
        a.out.write_text(json.dumps(plain({"reproduction": "alignedserve", "seed": a.seed, "steps_done": done,
                                           "timings_cpu_s": timings, "load_average": load,
                                           "finished_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                                           "results": out}), default=json_default))
        run.say(f"[standalone] {label}: {timings[label]:.0f} s CPU")
    return 0


def _load() -> float | None:
    try:
        import os

        return os.getloadavg()[0]
    except OSError:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
