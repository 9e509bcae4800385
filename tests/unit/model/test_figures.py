"""One definition per figure (syncscope.model.figures), the same in every output."""

from __future__ import annotations

import dataclasses
import json
import re
import statistics

import pytest
from rich.console import Console

from syncscope.analysis.advice import SNIPPETS
from syncscope.analysis.diagnose import diagnose
from syncscope.model import (
    Collective,
    Finding,
    Run,
    Window,
    figures,
)
from syncscope.model.figures import mean, median
from syncscope.render.diff import compare, render_diff_text
from syncscope.render.html import render_html
from syncscope.render.json_report import report_dict
from syncscope.render.summary import headline, label_of
from syncscope.render.terminal import figures_line, render_text
from syncscope.testing.track import Stats
from syncscope.text import escape_html, human_ns
from tests.helpers import runs


def _with_windows(run: Run, change) -> Run:  # type: ignore[no-untyped-def]
    ranks = tuple(
        dataclasses.replace(r, windows=tuple(change(w) for w in r.windows)) for r in run.ranks
    )
    return dataclasses.replace(run, ranks=ranks)


def _stretched(run: Run, factor: float) -> Run:
    """``run`` with every window lasting ``factor`` times as long (its collectives as they are)."""
    ranks = tuple(
        dataclasses.replace(
            r,
            windows=tuple(
                dataclasses.replace(w, end_ns=w.start_ns + int(w.duration_ns * factor))
                for w in r.windows
            ),
        )
        for r in run.ranks
    )
    return dataclasses.replace(run, ranks=ranks)


def _stretch(index: int, factor: float):  # type: ignore[no-untyped-def]
    def change(w: Window) -> Window:
        if w.index != index:
            return w
        return dataclasses.replace(w, end_ns=w.start_ns + int(w.duration_ns * factor))

    return change


def test_first_window_and_outliers_are_apart_and_not_averaged_in() -> None:
    # GIVEN 6 windows of 4.2 ms where window 4 took 10x as long (a recompilation)
    run = _with_windows(runs.make_run(windows=6, sync_at=runs.every), _stretch(4, 10))
    steady = figures.steady_windows(run)
    # THEN window 0 (first) and window 4 (outlier) are apart; the figure is the steady median
    assert steady.windows == (1, 2, 3, 5)
    assert [i for i, _ in steady.warmup] == [0, 4]
    assert "10.0x the median" in dict(steady.warmup)[4]
    time = figures.window_time(run, steady)
    assert time is not None and time.median == 4.2e6 and time.n == 8
    warm = figures.warmup_time(run, steady)
    assert warm is not None and warm.high == 42e6
    # AND the terminal shows the warm-up windows on rows of their own
    text = render_text(run, diagnose(run))
    assert re.search(r"│ 0 \(warm-up\)\s+│", text) and re.search(r"│ 4 \(warm-up\)\s+│", text)
    assert "window time 4.2 ms (median over ranks and 4 steady windows; apart: window 0" in text


def test_a_single_window_run_says_it_has_no_steady_window() -> None:
    run = runs.make_run(windows=1)
    steady = figures.steady_windows(run)
    assert steady.windows == () and steady.warmup == ((0, "the only complete window"),)
    head = headline(run, [])
    assert head.window_ns == 4.2e6  # the first window's, said so
    assert "first window only" in render_text(run, [])


def test_comm_time_is_a_union_and_never_exceeds_the_window() -> None:
    # GIVEN 4 buckets per micro-batch whose in-flight intervals overlap
    run = runs.make_run(sync_at=runs.every, buckets=4)
    w = run.ranks[0].windows[1]
    summed = sum(c.duration_ns for c in w.collectives)
    union = figures.comm_ns(w)
    # THEN the sum of durations double-counts; the union is what is in flight
    assert union < summed
    assert union == 4 * 600_000  # per micro-batch: 0.5 ms + 3 x 0.1 ms .. + 0.3 ms
    assert union <= w.duration_ns
    # AND every output reports that one figure
    report = report_dict(run, diagnose(run))
    assert report["figures"]["comm_in_flight_ns"]["median"] == union
    assert report["ranks"][0]["windows"][1]["comm_in_flight_ns"] == union
    assert f"comm time {human_ns(union)}" in render_text(run, [])


def test_exposed_sync_time_of_a_hand_written_loop_counts_the_wait() -> None:
    # GIVEN a blocking all-reduce issued after the backward: the call returns at once, the
    # thread waits until completion (dist.all_reduce with async_op=False)
    w = runs.make_run().ranks[0].windows[0]
    mb = w.micro_batches[0]
    c = Collective(0, "all_reduce", "allreduce_", 4, "float32", None, "0", mb.end_ns,
                   mb.end_ns + 10_000, mb.end_ns + 500_000, "after-backward", 0, True,
                   "user")  # fmt: skip
    w = dataclasses.replace(w, collectives=(c,))
    assert figures.exposed_sync_ns(w, 0) == 500_000
    assert figures.early_sync_ns(w) == 500_000


def test_window_time_is_the_same_figure_in_every_output() -> None:
    run = _with_windows(runs.make_run(windows=5, sync_at=runs.every), _stretch(0, 3))
    findings = diagnose(run)
    head = headline(run, findings)
    shown = human_ns(head.window_ns)
    assert shown == "4.2 ms"  # the steady windows, not pulled up by the 12.6 ms first window
    report = report_dict(run, findings)
    assert report["figures"]["window_time_ns"]["median"] == head.window_ns
    assert Stats.from_run(run).figures["window_time_ns"] == report["figures"]["window_time_ns"]
    assert f"window time {shown}" in render_text(run, findings)
    assert f'<div class="value">{shown}</div>' in render_html(run, findings)
    assert f"window time {shown} -> {shown}" in compare(run, findings, run, findings).subtitle
    # AND the finding's window time is that figure too
    redundant = next(f for f in findings if f.kind == "redundant-sync")
    assert redundant.cost["window_ns"] == head.window_ns


def test_memory_not_measured_is_never_zero() -> None:
    run = _with_windows(runs.clean_ddp(), lambda w: dataclasses.replace(w, peak_memory_bytes=0))
    assert figures.peak_memory(run) is None
    page = render_html(run, [])
    assert "not measured" in page and "0 B" not in page
    assert "peak memory: not measured" in page  # the per-window chart draws no 0 MiB line
    assert "peak memory not measured" in render_text(run, [])
    assert report_dict(run, [])["figures"]["peak_memory_bytes"] is None
    diff = render_diff_text(compare(run, [], runs.clean_ddp(), []))
    assert re.search(r"peak memory\s+not measured\s+51\d\.0 MiB", diff)


def test_projection_is_a_range_with_its_basis() -> None:
    run = runs.redundant()
    findings = diagnose(run)
    p = headline(run, findings).projection
    assert p is not None and p.shown and p.speedup is not None
    assert p.steady_windows == 3 and p.speedup.n == 6
    page = render_html(run, findings)
    assert "projected speed-up" in page and "from 3 steady windows" in page
    assert escape_html(figures.BASIS) in page


def test_projection_is_omitted_with_the_reason_when_the_run_cannot_support_it() -> None:
    # too few steady windows: a 2-window run has one, after the warm-up window
    short = runs.make_run(windows=2, sync_at=runs.every)
    page = render_html(short, diagnose(short))
    assert "not projected" in page and "too few steady windows (1" in page
    assert "projected speed-up" in render_text(short, diagnose(short))
    # window time varying more than the gain: steady windows of 4.2, 8.4, 12.6 and 16.8 ms
    noisy = runs.make_run(windows=5, sync_at=runs.every)
    for i, factor in ((2, 2), (3, 3), (4, 4)):
        noisy = _with_windows(noisy, _stretch(i, factor))
    findings = diagnose(noisy)
    p = headline(noisy, findings).projection
    assert p is not None and not p.shown
    assert p.omitted.startswith("window time varies more than the predicted gain")
    assert headline(noisy, findings).speedup is None
    assert "window time varies more than the predicted gain" in render_html(noisy, findings)


def test_cost_and_evidence_show_labels_with_units_not_key_names() -> None:
    run = runs.redundant()
    page = render_html(run, diagnose(run))
    for key in ("window ns", "projected window ns", "redundant time ns per window"):
        assert f"<dt>{key}</dt>" not in page
    assert "<dt>projected window time after the fix</dt>" in page
    assert "<dt>window time (median, steady windows)</dt>" in page
    assert label_of("some_new_ns_per_window") == "some new time per window"


def test_fix_summaries_are_text_not_markdown() -> None:
    fix = SNIPPETS["ddp-no_sync"]
    assert "*and*" in fix.summary  # written with emphasis ...
    finding = Finding("redundant-sync", "warning", "other", "m", (0,), (0,), fix=fix)
    page = render_html(runs.redundant(), [finding])
    assert "forward <em>and</em> backward" in page and "*and*" not in page  # ... shown as such
    text = render_text(runs.redundant(), [finding])
    assert "forward and backward" in text and "*and*" not in text


def test_timeline_title_matches_the_windows_drawn() -> None:
    def title(run: Run) -> str:
        page = render_html(run, [])
        return json.dumps(page[page.index('id="fig-timeline"') :][:20000])

    assert "Timeline, windows 0-2 of 4" in title(runs.make_run(windows=4))
    assert "Timeline, windows 0-1 of 2" in title(runs.make_run(windows=2))
    assert "Timeline, window 0 of 1" in title(runs.make_run(windows=1))


def test_after_skip_windows_the_first_captured_window_is_steady_and_projected() -> None:
    # GIVEN `--skip-windows 1 --windows 2`: the captured windows are the program's 1 and 2
    run = runs.make_run(windows=3, sync_at=runs.every)
    run = dataclasses.replace(
        run,
        ranks=tuple(dataclasses.replace(r, windows=r.windows[1:]) for r in run.ranks),
    )
    steady = figures.steady_windows(run)
    # THEN neither is warm-up (the program's first step was skipped) and both count
    assert steady.windows == (1, 2) and steady.warmup == ()
    p = figures.projection(run, steady=steady)
    assert p.steady_windows == 2 and p.shown, p.omitted


def _card_numbers(text: str) -> tuple[float, float, float, float]:
    flat = " ".join(text.replace("│", " ").split())  # the card's lines joined
    m = re.search(
        r"([\d.]+) ms of exposed sync time before the last micro-batch \((\d+)% of window "
        r"time\); window ([\d.]+) ms -> ~([\d.]+) ms",
        flat,
    )
    assert m, text
    return float(m[1]), float(m[2]), float(m[3]), float(m[4])


def test_a_redundant_sync_cards_figures_are_computed_from_each_other() -> None:
    # GIVEN a run that syncs on every micro-batch, one window slower than the others
    run = _with_windows(runs.make_run(windows=6, sync_at=runs.every), _stretch(3, 1.3))
    (f,) = [f for f in diagnose(run) if f.kind == "redundant-sync"]
    c = {k: float(v) for k, v in f.cost.items() if isinstance(v, (int, float))}
    # THEN exposed = window - projected and share = exposed / window, exactly
    assert c["redundant_time_ns_per_window"] == c["window_ns"] - c["projected_window_ns"]
    assert c["share_of_window_time"] == c["redundant_time_ns_per_window"] / c["window_ns"]
    # AND the printed card agrees with itself to its rounding
    exposed, share, window, projected = _card_numbers(render_text(run, [f]))
    assert abs(window - exposed - projected) <= 0.15
    assert abs(exposed / window * 100 - share) <= 1.5
    # AND with the summary's projection (one source)
    p = figures.projection(run, f.ranks)
    assert p.shown and p.projected is not None and p.window is not None
    assert c["projected_window_ns"] == p.projected.median and c["window_ns"] == p.window.median


def test_an_omitted_projection_is_omitted_on_the_card_too() -> None:
    # GIVEN 2 windows: the first is warm-up, 1 steady window is too few to project
    run = runs.make_run(windows=2, sync_at=runs.every)
    findings = diagnose(run)
    (f,) = [f for f in findings if f.kind == "redundant-sync"]
    reason = figures.projection(run, f.ranks).omitted
    assert reason.startswith("too few steady windows")
    # THEN the card, the summary, report.json and the HTML say the same: not projected
    assert "projected_window_ns" not in f.cost and f.cost["projection_omitted"] == reason
    text = render_text(run, findings)
    assert "after the fix" not in text and "window time not projected: too few" in text
    assert "not projected: too few steady windows" in headline(run, findings).projection.text()
    report = report_dict(run, findings)
    assert report["figures"]["projection"]["omitted"] == reason
    (card,) = [x for x in report["findings"] if x["kind"] == "redundant-sync"]
    assert card["cost"]["projection_omitted"] == reason
    html = render_html(run, findings)
    assert "window time not projected" in html and "projected window time after" not in html


def test_exposed_communication_never_exceeds_communication_one_definition() -> None:
    from syncscope.analysis.exposed import exposed_communication

    # GIVEN a traced run where one window's measured exposure exceeds its communication
    def inflate(w: Window) -> Window:
        if w.comm_ns is None or w.index != 2:
            return w
        return dataclasses.replace(w, exposed_comm_ns=w.comm_ns * 3)

    run = _with_windows(runs.traced(), inflate)
    (f,) = exposed_communication(run)
    exposed, comm = float(f.cost["exposed_ns_per_window"]), float(f.cost["comm_ns_per_window"])  # type: ignore[arg-type]
    # THEN exposed <= communication, and the communication is the summary's comm time
    assert 0 < exposed <= comm
    summary_comm = figures.comm_time(run)
    assert summary_comm is not None and comm == int(summary_comm.median)
    # AND the share is exposed / window of the figures shown, the same on the HTML tile
    share = float(f.cost["exposed_share"])  # type: ignore[arg-type]
    assert abs(share - exposed / float(f.cost["window_ns"])) < 1e-3  # type: ignore[arg-type]
    assert headline(run, [f]).exposed_comm_share == figures.exposed_share(run)
    assert f"{share:.0%}" in render_html(run, [f])
    # AND the message states both, exposed first
    assert re.search(r"[\d.]+ \w?s of the [\d.]+ \w?s of communication per window", f.message)


def test_the_projected_speed_up_is_the_ratio_of_the_figures_shown_beside_it() -> None:
    """Once "median 1.55x" sat beside "13.9 ms -> 9.2 ms" (1.51x): the speed-up's middle
    figure is the shown window over the shown projected window; the range stays the range
    of the per-(rank, window) ratios."""
    run = runs.make_run(windows=6, sync_at=runs.every)
    factors = {(0, 2): 1.3, (0, 3): 1.1, (1, 3): 1.45, (1, 4): 1.2, (1, 5): 1.6}
    run = dataclasses.replace(
        run,
        ranks=tuple(
            dataclasses.replace(
                r,
                windows=tuple(
                    _stretch(w.index, factors.get((r.rank, w.index), 1.0))(w) for w in r.windows
                ),
            )
            for r in run.ranks
        ),
    )
    p = headline(run, diagnose(run)).projection
    assert p is not None and p.speedup and p.window and p.projected
    assert p.speedup.median == p.window.median / p.projected.median
    assert p.speedup.low < p.speedup.median < p.speedup.high
    text = " ".join(render_text(run, diagnose(run), width=200).split())
    shown = re.search(r"median (\d\.\d\d)x\) .*?window ([\d.]+) ms -> ~([\d.]+) ms", text)
    assert shown, text
    window, after = float(shown[2]), float(shown[3])  # each rounded to 0.1 ms
    assert (window - 0.05) / (after + 0.05) <= float(shown[1]) <= (window + 0.05) / (after - 0.05)


def test_the_exposed_communication_card_uses_one_statistic() -> None:
    """One card said 15.3 ms (a median) in its message and 16.1 ms (a mean) in its
    evidence for the same quantity: one statistic, the medians of the cost, everywhere."""
    from syncscope.analysis.exposed import exposed_communication

    (finding,) = exposed_communication(runs.traced())
    assert not any(k.startswith("mean_") for k in finding.evidence)
    text = " ".join(render_text(runs.traced(), [finding], width=200).split())
    comm = human_ns(float(str(finding.cost["comm_ns_per_window"])))
    assert f"of the {comm} of communication per window" in text
    assert "mean" not in text.split("exposed-communication", 1)[1]


HTA = {
    "comm_comp_overlap_pct": {0: 14.31, 1: 12.0},
    "temporal_breakdown": [
        {"rank": 0.0, "idle_time(us)": 338781.0, "compute_time(us)": 75169.0,
         "non_compute_time(us)": 21636.0, "kernel_time(us)": 435586.0, "idle_time_pctg": 77.78,
         "compute_time_pctg": 17.26, "non_compute_time_pctg": 4.97},
    ],
}  # fmt: skip


def test_hta_figures_read_as_sentences_not_python_dicts() -> None:
    """``analyze --hta`` printed raw Python dicts; the terminal and the page say
    the same sentences, and report.json keeps the data."""
    from syncscope.analysis.exposed import exposed_communication

    run = runs.traced()
    findings = exposed_communication(run, HTA)
    text = " ".join(render_text(run, findings, width=200).split())
    page = render_html(run, findings)
    for shown in (text, page):
        assert "communication overlapped with compute: rank 0 14.3%, rank 1 12.0%" in shown
        assert "rank 0: idle 338.8 ms (77.8%), compute 75.2 ms (17.3%)" in shown
        assert "GPU kernel time 435.6 ms" in shown
        assert "{" + "0: 14.31" not in shown and "'idle_time(us)'" not in shown
        assert "idle_time(us)" not in shown.replace("&#x27;", "'")
    assert report_dict(run, findings)["findings"][0]["evidence"]["hta"] == HTA


@pytest.mark.parametrize("values", [[5], [3, 1], [1, 2, 3], [2, 10**15, 7, 1]])
def test_mean_and_median_match_the_standard_library(values: list[int]) -> None:
    assert mean(values) == statistics.fmean(values)
    assert median(values) == statistics.median(values)
    assert isinstance(median(values), float)


def test_mean_of_nothing_is_zero() -> None:
    assert mean([]) == 0.0
    assert mean(iter([])) == 0.0


# The projected speed-up's range on CPU ranks reaches up to the early syncs' whole time in flight,
# and says why beside it; on GPU ranks it is the exposed-wait range alone.


def _on(device: str, run: Run) -> Run:
    ranks = tuple(dataclasses.replace(r, device=device) for r in run.ranks)
    return dataclasses.replace(run, ranks=ranks)


def test_cpu_ranks_widen_the_range_to_the_syncs_time_in_flight() -> None:
    # GIVEN every micro-batch all-reduces 2 buckets, the first issued 100 us before the second
    run = runs.redundant()
    cpu, gpu = figures.projection(_on("cpu", run)), figures.projection(_on("cuda", run))
    assert cpu.speedup is not None and gpu.speedup is not None
    # THEN on GPU: the exposed-wait figure (1 ms window - 0.42 ms waited per early micro-batch)
    assert gpu.widened == ""
    assert round(gpu.speedup.low, 2) == round(gpu.speedup.high, 2) == 1.43
    # on CPU: the same median and low end, the top at the syncs' whole time in flight (from
    # the first bucket's issue, 0.5 ms into the micro-batch, to its end), and the reason
    assert cpu.speedup.median == gpu.speedup.median
    assert cpu.speedup.low == gpu.speedup.low
    early = 3 * 500_000
    window = 4 * 1_000_000 + 200_000
    assert round(cpu.speedup.high, 3) == round(window / (window - early), 3)
    assert cpu.widened.startswith("range widened: the ranks compute on CPU")
    assert "(range widened: the ranks compute on CPU" in cpu.text()


def test_the_reason_is_printed_beside_the_range_and_kept_in_report_json() -> None:
    run = runs.redundant()
    findings = [runs.finding()]
    console = Console(record=True, width=400, color_system=None)
    console.print(figures_line(run, findings))
    line = next(ln for ln in console.export_text().splitlines() if "projected" in ln)
    assert "1.43-1.56x (median 1.43x)" in line
    assert "range widened: the ranks compute on CPU" in line
    projection = report_dict(run, findings)["figures"]["projection"]
    assert projection["widened"].startswith("range widened: the ranks compute on CPU")
    gpu = report_dict(_on("cuda", run), findings)["figures"]["projection"]
    assert gpu["widened"] is None


def test_syncs_waited_on_whole_are_not_widened() -> None:
    # one bucket per micro-batch: its whole flight is waited on, nothing overlaps to contend
    run = runs.make_run(sync_at=runs.every, buckets=1)
    p = figures.projection(run)
    assert p.shown and "range widened" not in p.widened


def test_short_windows_on_cpu_say_the_range_is_a_floor() -> None:
    # GIVEN CPU ranks whose steady windows last a few milliseconds (each sync's fixed cost of
    # a call weighs as much as its wait there, and no figure measures it)
    run = runs.make_run(sync_at=runs.every, buckets=1)
    p = figures.projection(run)
    # THEN the range is read as a floor, with the window time in the reason
    assert p.shown and "at windows of 4.2 ms on CPU" in p.text()
    assert "read the range as a floor" in p.text()
    # AND not on a GPU, nor on CPU windows of 20 ms and more
    assert "at windows of" not in figures.projection(_on("cuda", run)).widened
    assert "at windows of" not in figures.projection(_stretched(run, 6.0)).widened


def test_fsdp_on_cpu_says_the_range_is_a_floor() -> None:
    # GIVEN FSDP ranks on CPU (their reduce-scatters removed also speed up the all-gathers)
    run = runs.make_run(sync_at=runs.every, buckets=1)
    ranks = tuple(
        dataclasses.replace(
            r, wrappers=tuple(dataclasses.replace(w, kind="fsdp") for w in r.wrappers)
        )
        for r in run.ranks
    )
    fsdp = dataclasses.replace(run, ranks=ranks)
    p = figures.projection(fsdp)
    assert p.shown and "read the range as a floor" in p.text()
    assert "range widened" not in p.text()  # nothing overlapped: the range itself is not wider
    assert figures.projection(_on("cuda", fsdp)).widened == ""


# A projection is compared with a measurement that has noise of its own: the projected range's
# low end allows for the window time's noise in the run, and the measured speed-up carries its
# own noise range; ``judge`` places one against the other, for ``fix --verify`` and the
# benchmarks alike.


def _varied(run: Run, factors: dict[int, float]) -> Run:
    """``run`` with window ``i`` lasting ``factors[i]`` times as long, on every rank."""
    for index, factor in factors.items():
        run = _with_windows(run, _stretch(index, factor))
    return run


def test_the_low_end_allows_for_the_window_times_own_noise() -> None:
    # GIVEN GPU ranks whose steady windows vary by a few percent (windows 1-5)
    quiet = _on("cuda", runs.make_run(windows=6, sync_at=runs.every))
    noisy = _varied(quiet, {2: 1.06, 3: 1.03, 5: 1.1})
    p, q = figures.projection(noisy), figures.projection(quiet)
    assert p.shown and q.shown and p.speedup and q.speedup and p.window
    durations = figures.window_durations(noisy)
    q25, q75 = statistics.quantiles(durations, n=4, method="inclusive")[::2]
    # THEN the low end is the least per-window ratio times q25/q75 of the window time
    ratios = [d / (d - 3 * 420_000) for d in durations]  # 3 early syncs of 0.42 ms saved
    assert p.speedup.low == pytest.approx(min(ratios) * q25 / q75, rel=1e-3)
    assert p.speedup.low < min(ratios)
    # AND the reason is printed beside the range, with how far it lowered it
    pct = (1 - q25 / q75) * 100
    assert f"low end lowered {pct:.1f}% for the window time's own noise" in p.text()
    # AND the median stays the exposed-wait figure, the top the least-to-most range
    assert p.speedup.median == pytest.approx(p.window.median / p.projected.median)  # type: ignore[union-attr]
    assert p.speedup.high == pytest.approx(max(ratios), rel=1e-3)
    # AND windows that do not vary lower nothing, and say nothing
    steady = figures.window_durations(quiet)
    assert q.widened == "" and q.speedup.low == pytest.approx(
        min(d / (d - 3 * 420_000) for d in steady), rel=1e-3
    )


def test_noise_never_lowers_the_low_end_below_no_gain() -> None:
    # GIVEN windows that vary (a quartile spread under the saving, so a range is shown) and
    # one twice as long, whose ratio, the least, is near 1x
    quiet = _on("cuda", runs.make_run(windows=8, sync_at=runs.every))
    noisy = _varied(quiet, {2: 1.2, 3: 1.25, 6: 2.0})
    p = figures.projection(noisy)
    assert p.shown and p.speedup
    durations = figures.window_durations(noisy)
    q25, q75 = statistics.quantiles(durations, n=4, method="inclusive")[::2]
    least = min(d / (d - 3 * 420_000) for d in durations)
    assert least * q25 / q75 < 1.0  # the noise alone would reach a slowdown
    # THEN the low end stops at 1.00x (removing a sync does not slow a step), and the reason
    # says how far it was lowered, not how far the noise reached
    assert p.speedup.low == pytest.approx(1.0)
    assert f"low end lowered {(1 - 1 / least) * 100:.1f}%" in p.widened
    assert "not below 1.00x" in p.widened


def test_noise_under_half_a_percent_of_the_low_end_is_not_worth_a_word() -> None:
    quiet = _on("cuda", runs.make_run(windows=6, sync_at=runs.every))
    p = figures.projection(_varied(quiet, {2: 1.004, 4: 1.003}))
    assert p.shown and "own noise" not in p.widened and p.widened == ""


def test_the_noise_reason_and_the_floor_are_kept_in_report_json() -> None:
    run = _varied(runs.make_run(windows=6, sync_at=runs.every, buckets=1), {2: 1.08, 4: 1.05})
    projection = report_dict(run, [runs.finding()])["figures"]["projection"]
    assert "for the window time's own noise" in projection["widened"]
    assert projection["floor"] is True  # windows of 4.2 ms on CPU: a floor
    gpu = report_dict(_on("cuda", run), [runs.finding()])["figures"]["projection"]
    assert gpu["floor"] is False and "at windows of" not in gpu["widened"]


def test_a_measured_speed_up_carries_each_runs_quartiles_as_its_noise() -> None:
    original = [100.0, 104.0, 96.0, 110.0, 90.0]
    fixed = [50.0, 51.0, 49.0, 55.0, 45.0]
    s = figures.measured_speedup(original, fixed)
    assert s is not None
    assert s.median == pytest.approx(100 / 50)
    assert s.low == pytest.approx(96 / 51) and s.high == pytest.approx(104 / 49)
    assert figures.measured_speedup([], fixed) is None
    assert figures.measured_speedup(original, []) is None


def _speedup(median: float, low: float, high: float) -> figures.Stat:
    return figures.Stat(median, low, high, 10)


@pytest.mark.parametrize(
    ("measured", "floor", "expected"),
    [
        ((1.60, 1.50, 1.70), False, "inside"),
        ((1.349, 1.30, 1.40), False, "inside"),  # 1.35x against a low end of 1.35x, as printed
        ((1.30, 1.25, 1.36), False, "within noise"),  # below, its noise reaching the range
        ((2.10, 1.98, 2.30), False, "within noise"),  # above, likewise
        ((1.20, 1.10, 1.30), False, "below"),
        ((2.30, 2.10, 2.50), False, "above"),
        ((3.00, 2.80, 3.20), True, "inside"),  # above a floor is what a floor says
        ((1.30, 1.25, 1.36), True, "within noise"),
        ((1.10, 1.00, 1.20), True, "below"),
    ],
)
def test_judge_places_a_measurement_against_a_projected_range(
    measured: tuple[float, float, float], floor: bool, expected: str
) -> None:
    projected = _speedup(1.40, 1.35, 2.00)
    assert figures.judge(_speedup(*measured), projected, floor) == expected
