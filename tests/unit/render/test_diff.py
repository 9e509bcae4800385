"""``compare`` and its renderers on hand-built runs, and the ``syncscope diff`` command."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import pytest

from syncscope import cli
from syncscope.analysis.diagnose import diagnose
from syncscope.commands import saved
from syncscope.model import Finding, Run
from syncscope.render.diff import compare, render_diff_html, render_diff_text
from tests.helpers import runs


def test_fixing_redundant_syncs_resolves_the_finding_and_improves_every_number() -> None:
    # GIVEN a run syncing every micro-batch, and the same job after the fix
    d = compare(runs.redundant(), [runs.finding()], runs.clean_ddp(), [])
    # THEN the finding is resolved and nothing is new
    assert [f.kind for f in d.resolved] == ["redundant-sync"]
    assert d.new == () and d.persisting == ()
    assert d.tone == "clean"
    changes = {m.label: m for m in d.metrics}
    syncs = changes["grad syncs per window"]
    assert (syncs.before, syncs.after, syncs.change) == (4, 1, "better")
    assert changes["grad sync bytes per window"].change == "better"
    assert changes["grad sync bytes per window"].delta == "-75%"
    assert changes["peak memory"].change == "same"
    assert "exposed communication per window" not in changes  # no trace in either run


def test_a_new_error_makes_the_diff_red() -> None:
    missing = runs.finding("missing-sync", "error", cause="flag-after-forward")
    d = compare(runs.clean_ddp(), [], runs.divergent(), [missing])
    assert d.new == (missing,)
    assert d.tone == "errors"
    assert d.title == "1 new"


def test_same_kind_and_cause_persists_while_another_cause_is_new() -> None:
    before = [runs.finding(cause="no-no_sync")]
    after = [runs.finding(cause="no-no_sync"), runs.finding(cause="backward-only-no_sync")]
    d = compare(runs.redundant(), before, runs.redundant(), after)
    assert [f.cause for f in d.persisting] == ["no-no_sync"]
    assert [f.cause for f in d.new] == ["backward-only-no_sync"]
    assert d.resolved == ()


def test_fewer_syncs_than_expected_is_worse_not_better() -> None:
    # Dropping from 1 sync per window to 0 saves bytes but breaks training.
    none = runs.make_run(sync_at=lambda r, w, m, n: False)
    d = compare(runs.clean_ddp(), [], none, [])
    syncs = {m.label: m for m in d.metrics}["grad syncs per window"]
    assert syncs.change == "worse"


def test_overlap_metric_appears_with_trace_data() -> None:
    d = compare(runs.traced(), [], runs.traced(), [])
    assert "exposed communication per window" in {m.label for m in d.metrics}


def test_text_rendering_plain_and_coloured() -> None:
    d = compare(runs.redundant(), [runs.finding()], runs.clean_ddp(), [])
    plain = render_diff_text(d)
    assert "syncscope diff: before -> after" in plain
    assert "1 finding resolved" in plain
    assert "resolved (1)" in plain and "redundant-sync" in plain
    assert "grad syncs per window" in plain and "better" in plain
    assert "\x1b[" not in plain
    assert "\x1b[" in render_diff_text(d, color=True)


def test_text_never_interprets_run_strings_as_markup() -> None:
    f = replace(runs.finding(), message="see [bold]train.py[/bold] and [red]x")
    d = compare(runs.redundant(), [f], runs.clean_ddp(), [])
    assert "[bold]train.py[/bold] and [red]x" in render_diff_text(d)


def test_html_diff_escapes_and_draws() -> None:
    bad = runs.finding(script=f"{runs.XSS}.py")
    d = compare(runs.redundant(), [bad], runs.malicious(), [], labels=(f"{runs.XSS}", "after"))
    page = render_diff_html(d)
    assert 'data-figure="fig-diff"' in page
    assert 'id="metrics"' in page
    head, _, _ = page.partition("<script>")  # the part before plotly.js
    rest = page[page.index("</head>") :]
    assert "<img" not in head + rest
    assert "&lt;img src=x onerror=alert(1)&gt;" in rest


# The command --------------------------------------------------------------------------------


@pytest.fixture
def saved_runs(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[Run, list[Finding]]]:
    table = {"before": (runs.redundant(), [runs.finding()]), "after": (runs.clean_ddp(), [])}
    monkeypatch.setattr(saved, "load_and_diagnose", lambda path: table[Path(path).name])
    return table


def test_diff_command_prints_and_writes_html(
    tmp_path: Path, saved_runs: object, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "diff.html"
    a, b = str(tmp_path / "x" / "before"), str(tmp_path / "y" / "after")
    assert cli.main(["diff", a, b, "--html", str(page), "--no-color"]) == 0
    captured = capsys.readouterr()
    assert "syncscope diff: before -> after" in captured.out
    assert "resolved (1)" in captured.out
    assert "\x1b[" not in captured.out
    assert "fig-diff" in page.read_text()
    assert str(page) in captured.err


def test_diff_command_missing_run_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert capsys.readouterr().err.startswith("syncscope: error:")


def test_diff_shows_the_range_of_grad_syncs_never_a_rounded_mean() -> None:
    # GIVEN windows with 4, 4, 4 and 2 grad syncs (mean 3.5), then a fixed run with 1
    def uneven(rank: int, window: int, mb: int, n: int) -> bool:
        return mb == n - 1 or (window < 3) or (window == 3 and mb == 0)

    before = runs.make_run(windows=4, sync_at=uneven)
    after = runs.make_run(windows=4)
    text = render_diff_text(compare(before, diagnose(before), after, diagnose(after)))
    # THEN the counts shown are what some window had: the range 2-4, then 1
    assert "grad syncs per window 2-4 -> 1 " in text
    assert "3.5" not in text and " 4 -> 1" not in text


def test_a_change_inside_the_windows_spread_is_within_noise() -> None:
    import dataclasses

    # GIVEN two runs whose window times overlap (one run's windows vary by +-40%)
    def jitter(factors: list[float]):  # type: ignore[no-untyped-def]
        def change(w):  # type: ignore[no-untyped-def]
            return dataclasses.replace(w, end_ns=w.start_ns + int(w.duration_ns * factors[w.index]))

        return change

    base = runs.make_run(windows=5)

    def stretched(factors: list[float]):  # type: ignore[no-untyped-def]
        f = jitter(factors)
        return dataclasses.replace(
            base,
            ranks=tuple(
                dataclasses.replace(r, windows=tuple(f(w) for w in r.windows)) for r in base.ranks
            ),
        )

    a = stretched([1.0, 1.0, 0.7, 1.4, 1.0])
    b = stretched([1.0, 1.2, 0.8, 1.3, 1.2])
    diff = compare(a, diagnose(a), b, diagnose(b))
    text = render_diff_text(diff)
    # THEN no speed-up or slow-down is claimed: the change is within noise, with the spread
    window = next(m for m in diff.metrics if m.label.startswith("window time"))
    assert window.change == "within noise"
    assert "within noise: windows" in diff.subtitle and "faster" not in diff.subtitle
    assert "within noise" in text and "worse" not in text
    # AND a change beyond both spreads is still called
    c = stretched([3.0, 3.0, 3.0, 3.0, 3.0])
    assert (
        next(
            m
            for m in compare(a, [], c, []).metrics
            if m is not None and m.label.startswith("window time")
        ).change
        == "worse"
    )


def _profiled_report(durations_ms: list[float]) -> dict[str, object]:
    from syncscope.model.figures import Stat

    windows = [
        {"index": i, "complete": True, "grad_syncs": 1, "duration_ns": int(d * 1e6)}
        for i, d in enumerate(durations_ms)
    ]
    steady = Stat.of([int(d * 1e6) for d in durations_ms[1:]])  # window 0: warm-up
    assert steady is not None
    figures = {"window_time_ns": asdict(steady)}  # as report.json writes it
    return {"ranks": [{"rank": 0, "windows": windows}], "findings": [], "figures": figures}


def test_fix_verify_compares_window_time_with_a_noise_band() -> None:
    from syncscope.fixes.verify import Verification, _summarize, render

    # GIVEN an original measured under load (windows 20-70 ms) and a fix measured quietly
    loaded = _summarize(_profiled_report([90, 32.2, 65.9, 20.0, 70.0]), "")
    quiet = _summarize(_profiled_report([40, 33.9, 30.0, 36.0]), "")
    fast = _summarize(_profiled_report([20, 12.8, 12.0, 13.5]), "")
    # THEN the first window (warm-up) is left out, the spread shown, and no gain claimed
    assert loaded.window_ms == pytest.approx((32.2 + 65.9) / 2)
    lines = render(Verification(loaded, quiet, True, None, False))
    assert any(line.startswith("window time: within noise") for line in lines), lines
    assert any("(20.0-70.0)" in line for line in lines)
    # AND a change beyond both ranges is called, with its ratio
    lines = render(Verification(quiet, fast, True, None, False))
    assert "window time: 2.65x faster, beyond the noise" in lines
