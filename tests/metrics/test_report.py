import sys

import pytest
from rich.console import Console

from metrics_builders import build_request
from servelab.core.request import SLO
from servelab.metrics.collector import MetricsCollector
from servelab.metrics.report import plot_sweep, render_markdown, render_rich, summary_rows
from servelab.metrics.request_metrics import RequestTable
from servelab.metrics.summary import summarize


def _summary(ttft_s: float):
    reqs = [build_request(0, 0.0, [ttft_s, ttft_s + 0.05], slo=SLO(ttft_s=0.2)),
            build_request(1, 0.5, [0.5 + ttft_s])]
    c = MetricsCollector()
    c.on_step(0, 0.0, 0.5, 16, 2, 0, 10, 100, 1, 1)
    for r in reqs:
        c.on_request_end(r)
    return summarize(RequestTable.from_requests(reqs), c)


def test_markdown_side_by_side():
    md = render_markdown({"vllm": _summary(0.1), "sarathi": _summary(0.3)})
    lines = md.splitlines()
    assert lines[0] == "| metric | vllm | sarathi |"
    attainment = next(line for line in lines if line.startswith("| SLO attainment"))
    assert attainment == "| SLO attainment | 100.0% | 50.0% |"
    assert any(line.startswith("| TTFT mean / p50 / p99 (ms) | 100.0 / 100.0 / 100.0 |") for line in lines)


def test_rich_table_renders():
    console = Console(record=True, width=160)
    console.print(render_rich(_summary(0.1), title="simulated"))
    text = console.export_text()
    assert "goodput (req/s)" in text and "run" in text


def test_rows_reject_non_summaries():
    with pytest.raises(ValueError, match="no run summaries"):
        summary_rows({})
    with pytest.raises(TypeError, match="'x' is a dict"):
        summary_rows({"x": {}})


def test_plot_sweep_writes_png(tmp_path):
    rows = [{"policy": p, "rate": r, "goodput": r * k if r < 4 else None}
            for p, k in (("vllm", 1.0), ("sarathi", 1.2)) for r in (1, 2, 3, 4)]
    out = plot_sweep(rows, "rate", "goodput", tmp_path / "fig" / "sweep.png", caption="simulated: test")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_sweep_bad_rows(tmp_path):
    with pytest.raises(ValueError, match="row 1 has no 'goodput'"):
        plot_sweep([{"policy": "a", "rate": 1, "goodput": 1}, {"policy": "a", "rate": 2}], "rate", "goodput",
                   tmp_path / "x.png", caption="c")
    with pytest.raises(ValueError, match="no rows"):
        plot_sweep([], "rate", "goodput", tmp_path / "x.png", caption="c")


def test_import_pulls_no_plotting():
    import subprocess

    code = ("import sys, servelab.metrics, servelab.metrics.report; "
            "assert not any(m.startswith('matplotlib') for m in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_headline_counts_endings_with_folded_top_reasons():
    from servelab.core.request import RequestStatus
    from servelab.metrics.report import headline, top_reasons

    reqs = [build_request(0, 0.0, [0.1]),
            build_request(1, 0.0, [], status=RequestStatus.REJECTED,
                          reason="prompt 5000 + max_tokens 8 exceeds max_model_len 4096"),
            build_request(2, 0.0, [], status=RequestStatus.REJECTED,
                          reason="prompt 4100 + max_tokens 9 exceeds max_model_len 4096"),
            build_request(3, 0.0, [], status=RequestStatus.ABORTED, reason="client went away")]
    c = MetricsCollector()
    for r in reqs:
        c.on_request_end(r)
    s = summarize(RequestTable.from_requests(reqs), c)
    assert top_reasons(s, "rejected") == [("prompt N + max_tokens N exceeds max_model_len N", 2)]
    assert headline("vllm", s) == ("vllm: 4 arrived, 1 completed, 2 rejected (2 over the context), 1 ABORTED; "
                                   "top rejection reasons: 2 x prompt N + max_tokens N exceeds max_model_len N; "
                                   "top abort reasons: 1 x client went away")
    md = render_markdown({"vllm": s})
    assert "| rejected | 2 (2 over the context) |" in md and md.rstrip().endswith(headline("vllm", s))


def test_long_latencies_are_shown_in_seconds():
    from servelab.metrics.report import _fit_units

    assert _fit_units(["TTFT mean / p50 / p99 (ms)", "4978067.0 / 12.0 / -"]) == \
        ["TTFT mean / p50 / p99 (s)", "4,978.1 / 0.0 / -"]
    assert _fit_units(["TTFT mean / p50 / p99 (ms)", "100.0 / 100.0 / 100.0"])[0].endswith("(ms)")


def test_sweep_plots_name_their_axes_with_units_and_show_every_series(tmp_path, monkeypatch):
    """Issue 31 (11): titles and axes were raw keys ("ttft_p99_s vs rate"), TPOT in s beside a
    table in ms, identical series hid each other, and the footer command was cut."""
    from matplotlib.figure import Figure

    saved = []
    real = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (saved.append(fig), real(fig, *a, **k))[1])
    rows = [{"policy": p, "rate": r, "tpot_p50_s": 0.02 * r} for p in ("vllm", "sarathi") for r in (1, 2)]
    command = "servelab sweep " + " ".join(f"--option-{k} value-{k}" for k in range(30))
    plot_sweep(rows, "rate", "tpot_p50_s", tmp_path / "tpot.png", caption=f"simulated: A100\n{command}")
    (fig,) = saved
    ax = fig.axes[0]
    assert ax.get_title() == "TPOT p50 vs request rate"
    assert ax.get_xlabel() == "request rate (req/s)" and ax.get_ylabel() == "TPOT p50 (ms)"
    assert [round(v, 6) for v in ax.lines[0].get_ydata()] == [20.0, 40.0]  # ms, as the tables print it
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["vllm", "sarathi (same as vllm)"]
    assert ax.lines[0].get_marker() != ax.lines[1].get_marker()
    footer = fig.texts[0].get_text()
    assert footer.replace("\n", " ").replace("  ", " ").endswith("--option-29 value-29")  # wrapped, not cut
    assert max(len(line) for line in footer.splitlines()) <= 120
