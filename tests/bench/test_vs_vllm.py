"""The vLLM comparison's plan, rates, resumption and report, without starting any server."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

from servelab.bench.vs_vllm import (Record, RunKey, Setup, client_command, default_loads, plan_runs, poisson_rate,
                                    read_records, server_command)
from servelab.bench.vs_vllm_report import client_agreement, medians, render, same_work

SETUP = Setup(checkpoint=Path("/ckpt/bench200m"), vllm_python=Path("/v/bin/python"), servelab_python=Path("/s/python"))


def _record(repeat, load, client, server, duration, rate=math.inf, tpot=100.0, cpu=20.0):
    metrics = {"duration": duration, "server_cpu_s": cpu, "completed": 32, "output_throughput": 2048 / duration, "median_ttft_ms": 1000.0,
               "p90_ttft_ms": 2000.0, "p99_ttft_ms": 3000.0, "median_tpot_ms": tpot, "p90_tpot_ms": tpot,
               "p99_tpot_ms": tpot}
    return Record(RunKey(repeat, load, client, server), rate, metrics, (1.0, 1.0, 1.0), (1.5, 1.0, 1.0), duration,
                  SETUP.fingerprint())


def test_the_eight_loads_and_their_order():
    loads = default_loads()
    assert len(loads) == 8 and len({ld.name for ld in loads}) == 8
    assert [ld.poisson for ld in loads] == [False] * 4 + [True] * 4  # the rates need the bursts first
    assert {(ld.prompt_tokens, ld.output_tokens) for ld in loads} == {(256, 64), (1024, 128)}
    assert {ld.num_requests for ld in loads} == {32, 128}


def test_plan_alternates_servers_and_runs_vllms_client_once():
    loads = default_loads()
    plan = plan_runs(loads, {"short-32-burst"}, None)
    firsts = [key.server for key, _ in plan[::2]]
    assert set(firsts) == {"servelab", "vllm"}  # each server goes first sometimes
    for (a, _), (b, _) in zip(plan[::2], plan[1::2]):  # runs come in pairs: same load and client, both servers
        assert (a.repeat, a.load, a.client) == (b.repeat, b.load, b.client) and a.server != b.server
    vllm_client = [key for key, _ in plan if key.client == "vllm"]
    assert {k.load for k in vllm_client} == {"short-32-burst"} and {k.repeat for k in vllm_client} == {0}
    assert max(k.repeat for k, _ in plan if k.load == "long-128-burst") == 0  # large loads: one repeat
    assert max(k.repeat for k, _ in plan if k.load == "short-32-burst") == 1


def test_poisson_rate_is_a_fraction_of_vllms_burst_capacity():
    load = next(ld for ld in default_loads() if ld.name == "short-32-poisson")
    assert poisson_rate(load, [], 0.9) is None
    records = [_record(0, "short-32-burst", "servelab", "servelab", 50.0),
               _record(0, "short-32-burst", "servelab", "vllm", 32.0)]
    assert poisson_rate(load, records, 0.9) == 0.9 * 32 / 32.0


def test_records_resume_only_for_the_same_setup(tmp_path):
    path = tmp_path / "runs.jsonl"
    rec = _record(0, "short-32-burst", "servelab", "vllm", 30.0)
    other = Record(**{**rec.__dict__, "setup": {**rec.setup, "dtype": "float32"}})
    path.write_text(json.dumps(rec.to_json()) + "\n" + json.dumps(other.to_json()) + "\n")
    back = read_records(path, SETUP)
    assert len(back) == 1 and back[0].key == rec.key and math.isinf(back[0].rate)


def test_both_servers_get_the_same_limits():
    s_argv, s_env = server_command(SETUP, "servelab")
    v_argv, v_env = server_command(SETUP, "vllm")
    for flag in ("--dtype", "--max-num-seqs", "--max-num-batched-tokens", "--block-size", "--max-model-len"):
        assert s_argv[s_argv.index(flag) + 1] == v_argv[v_argv.index(flag) + 1], flag
    assert s_env["OMP_NUM_THREADS"] == v_env["OMP_NUM_THREADS"] == "1"
    assert float(s_argv[s_argv.index("--kv-budget-mb") + 1]) == 1024 * float(v_env["VLLM_CPU_KVCACHE_SPACE"])
    load = default_loads()[0]
    assert "ids" in client_command(SETUP, "servelab", "vllm", load, math.inf, Path("/tmp/x.json"))
    v_client = client_command(SETUP, "vllm", "servelab", load, 1.5, Path("/tmp/x.json"))
    assert v_client[v_client.index("--request-rate") + 1] == "1.5" and "--ignore-eos" in v_client


def test_report_ratios_and_client_agreement():
    loads = tuple(ld for ld in default_loads() if ld.name == "short-32-burst")
    records = [_record(r, "short-32-burst", "servelab", "servelab", d) for r, d in ((0, 60.0), (1, 40.0))]
    records += [_record(r, "short-32-burst", "servelab", "vllm", 25.0) for r in (0, 1)]
    records += [_record(0, "short-32-burst", "vllm", "vllm", 26.0, cpu=30.0),
                _record(0, "short-32-burst", "vllm", "servelab", 70.0, cpu=21.0)]
    med = medians(records)
    assert med[("short-32-burst", "servelab", "servelab")]["duration"] == 50.0
    ratios, ok = client_agreement(med, "short-32-burst", "vllm")
    assert ok and abs(ratios["duration"] - 26 / 25) < 1e-9
    assert not client_agreement(med, "short-32-burst", "servelab")[1]  # 70 s vs 50 s
    assert same_work(med, "short-32-burst", "servelab")  # ... for the same 20-21 CPU seconds
    assert not same_work(med, "short-32-burst", "vllm")  # 30 vs 20 CPU s
    text = render(records, loads, SETUP.fingerprint(), {"machine": "test"}, "python scripts/vs_vllm.py")
    assert "**2.00x**" in text and "1 of 2 (load, server) pairs agree" in text
    assert "python scripts/vs_vllm.py" in text


def test_report_of_a_subset_names_the_loads_it_covers():
    loads = tuple(ld for ld in default_loads() if ld.name == "short-32-burst")
    records = [_record(0, "short-32-burst", "servelab", s, d) for s, d in (("servelab", 30.0), ("vllm", 25.0))]
    context = {"machine": "test", "loads_run": "Loads in this report: 1 of the issue's 8 (short-32-burst); not run "
               "this time: short-128-burst.", "scope": " that ran (1 of 8)"}
    text = render(records, loads, SETUP.fingerprint(), context, "python scripts/vs_vllm.py --loads short-32-burst")
    assert "Loads in this report: 1 of the issue's 8" in text
    assert "Targets: within 1.5x on every load that ran (1 of 8) (met)" in text
    plain = render(records, loads, SETUP.fingerprint(), {"machine": "test"}, "python scripts/vs_vllm.py")
    assert "Loads in this report" not in plain and "on every load (met)" in plain


def test_quiet_slot_holds_the_lock_and_renices_only_during_the_run(tmp_path):
    """Each run holds the shared lock (another flock on it fails meanwhile) and runs the server
    trees at the run's nice value; afterwards the lock is free and the nice value is back."""
    import fcntl
    import os
    import subprocess
    import sys

    from servelab.bench.vs_vllm import quiet_slot

    lock = tmp_path / "quiet.lock"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        base = os.getpriority(os.PRIO_PROCESS, child.pid)
        run_nice = min(19, base + 3)  # raising nice needs no privilege
        with quiet_slot(lock, [child.pid], run_nice):
            with open(lock) as other:
                try:
                    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held = False
                except BlockingIOError:
                    held = True
            assert held
            assert os.getpriority(os.PRIO_PROCESS, child.pid) == run_nice
        with open(lock) as other:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again
        if os.geteuid() == 0 or run_nice == base:  # lowering back needs root unless nothing changed
            assert os.getpriority(os.PRIO_PROCESS, child.pid) == base
    finally:
        child.kill()
        child.wait()


def test_records_keep_their_nice_value():
    rec = _record(0, "short-32-burst", "servelab", "vllm", 30.0)
    rec.nice = -15
    back = Record.from_json(json.loads(json.dumps(rec.to_json())))
    assert back.nice == -15
    old = rec.to_json()
    old.pop("nice")  # records written before the field existed
    assert Record.from_json(old).nice is None


def test_a_server_dies_with_the_benchmark_even_when_it_is_killed(tmp_path):
    """A server runs in its own session; SIGKILL of the process that started it must still end it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    code = ("import sys, time; from pathlib import Path; from servelab.bench.vs_vllm import spawn_server; "
            f"p = spawn_server(['sleep', '60'], None, Path({str(tmp_path / 'server.log')!r})); "
            "print(p.pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2])
    server = int(parent.stdout.readline())
    try:
        os.kill(server, 0)  # running
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(server, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"server {server} outlived its benchmark by 10 s")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGKILL)


def test_report_carries_the_earlier_reports_rows_for_loads_not_run_again():
    """A report over one load keeps the committed report's rows of the other loads verbatim, with
    where each row came from, and counts their ratios and client agreement; a load run again
    replaces its carried rows; a carried row keeps the source it already named."""
    from servelab.bench.vs_vllm_carry import parse_report

    loads = default_loads()
    old_records = [_record(0, "short-32-burst", c, s, d, cpu=d)
                   for c, s, d in (("servelab", "servelab", 60.0), ("servelab", "vllm", 50.0),
                                   ("vllm", "servelab", 61.0), ("vllm", "vllm", 51.0))]
    old_records += [_record(0, "short-128-burst", "servelab", s, d) for s, d in (("servelab", 200.0), ("vllm", 100.0))]
    for rec in old_records:
        rec.commit = "aaa1111"
    old_text = render(old_records, loads[:2], SETUP.fingerprint(), {"machine": "test"}, "old")
    carried = parse_report(old_text, "report of commit abc1234")
    assert carried.loads() == {"short-32-burst", "short-128-burst"}
    assert carried.ratios == {"short-32-burst": 1.2, "short-128-burst": 2.0}
    new = [_record(0, "long-32-burst", "servelab", s, d) for s, d in (("servelab", 90.0), ("vllm", 100.0))]
    for rec in new:
        rec.commit = "def5678"
    shown = tuple(ld for ld in loads if ld.name in {"short-32-burst", "long-32-burst"})
    text = render(new, shown, SETUP.fingerprint(), {"machine": "test"}, "new", carried)
    rows = [line for line in text.splitlines() if line.startswith("| short-32-burst")]
    assert len(rows) == 4 and all(row.endswith("| runs at aaa1111 (report of commit abc1234) |") for row in rows)
    assert "| 60.0 | 60.0 |" in rows[0]  # the cells themselves, verbatim
    assert any(line.startswith("| long-32-burst") and line.endswith("| runs at def5678 |")
               for line in text.splitlines())
    assert "Duration ratio servelab / vLLM: 0.90x to 1.20x (worst: short-32-burst)" in text
    assert "2 of 2 (load, server) pairs agree" in text
    assert "short-128-burst" not in text  # not asked for: not shown
    again = parse_report(text, "report of commit 9999999")  # carried twice: the first source stays
    assert {origin for rows in again.load_rows.values() for _, origin in rows} == {
        "runs at aaa1111 (report of commit abc1234)", "runs at def5678 (report of commit 9999999)"}


def test_a_run_with_failed_requests_is_not_kept(tmp_path, monkeypatch):
    """long-128-burst once ran with half its requests timed out in the client (600 s) and its
    shorter duration went into the report as if it were the load's; such a run is refused."""
    import sys

    import pytest

    from servelab.bench import vs_vllm

    load = default_loads()[0]

    def fake_client(completed, errors):
        def command(setup, client, server, load, rate, out):
            data = {"completed": completed, "duration": 1.0, "errors": errors}
            return [sys.executable, "-c", f"open({str(out)!r}, 'w').write({json.dumps(json.dumps(data))})"]
        return command

    key = RunKey(0, load.name, "servelab", "vllm")
    monkeypatch.setattr(vs_vllm, "client_command", fake_client(load.num_requests - 1, ["", "ReadTimeout"]))
    with pytest.raises(vs_vllm.IncompleteRun, match=rf"{load.num_requests - 1} of {load.num_requests} .*ReadTimeout"):
        vs_vllm.run_client(SETUP, key, load, math.inf, tmp_path)
    monkeypatch.setattr(vs_vllm, "client_command", fake_client(load.num_requests, []))
    assert vs_vllm.run_client(SETUP, key, load, math.inf, tmp_path).metrics["completed"] == load.num_requests


def test_the_bench_client_waits_hours_not_minutes_and_refuses_a_bad_timeout():
    import pytest

    from servelab.bench.run import BenchConfig
    from servelab.core.errors import UserError

    assert BenchConfig(base_url="http://x").timeout_s >= 3600
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(UserError, match="--request-timeout"):
            BenchConfig(base_url="http://x", timeout_s=bad)
