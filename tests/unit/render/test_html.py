"""The HTML report rendered from hand-built runs: content, escaping, size, scale, charts."""

from __future__ import annotations

import array
import base64
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import plotly.offline
import pytest
from plotly.subplots import make_subplots

from syncscope import cli
from syncscope.commands import saved
from syncscope.model import Finding, Run, RunMeta
from syncscope.render import charts
from syncscope.render.diff import compare, render_diff_html
from syncscope.render.html import render_html
from syncscope.render.page import figure_json
from syncscope.render.summary import grid_of, headline
from tests.helpers import runs

FIGURE = re.compile(r'<script type="application/json" data-figure="([^"]+)">(.*?)</script>', re.S)
DTYPES = {"u1": "B", "i2": "h", "u2": "H", "i4": "i", "f4": "f", "f8": "d"}


def figures(page: str) -> dict[str, dict[str, Any]]:
    return {name: json.loads(data) for name, data in FIGURE.findall(page)}


def values(spec: Any) -> list[float]:
    """Decode a typed-array spec (or pass a plain list through)."""
    if isinstance(spec, dict):
        return list(array.array(DTYPES[spec["dtype"]], base64.b64decode(spec["bdata"])))
    return list(spec)


def body(page: str) -> str:
    """The page without the inlined plotly.js bundle."""
    return page.replace(plotly.offline.get_plotlyjs(), "")


def strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for v in node.values() for s in strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in strings(v)]
    return []


def test_clean_run_says_so_and_draws_the_core_charts() -> None:
    page = render_html(runs.clean_ddp(), [])
    assert 'class="verdict clean"' in page
    assert "No gradient synchronization problems found" in page
    assert "1 <small>(1 expected)</small>" in page
    assert set(figures(page)) == {
        "fig-placement",
        "fig-syncs",
        "fig-window-metrics",
        "fig-timeline",
    }
    assert 'id="findings"' not in page


def test_redundant_run_headline_numbers() -> None:
    # GIVEN 4 syncs per window where 1 belongs, and a finding that prices the waste
    page = render_html(runs.redundant(), [runs.finding()])
    # THEN the verdict, the seen/expected count, the waste and the speed-up are up front
    assert 'class="verdict warnings"' in page
    assert "4 <small>(1 expected)</small>" in page
    assert "150.0 MiB" in page  # wasted bytes per window
    assert "43% of the window" in page
    # the speed-up is measured from the run's steady windows, not taken from a
    # finding's cost: each early micro-batch spends 0.42 ms in or waiting on its syncs, so a
    # 4.2 ms window projects to 2.94 ms
    assert "1.43x" in page
    assert "from 3 steady windows" in page and "basis: window time minus" in page


def test_page_is_self_contained() -> None:
    page = render_html(runs.redundant(), [runs.finding()])
    assert page.count(plotly.offline.get_plotlyjs()) == 1
    rest = body(page)
    assert "Content-Security-Policy" in rest and "default-src 'none'" in rest
    assert not re.search(r"<(script|img|link|iframe)[^>]+(src|href)=", rest)
    assert "http://" not in rest and "https://" not in rest


def test_run_strings_are_escaped_everywhere() -> None:
    # GIVEN a script, a note, a module and finding sources named like HTML
    run = runs.malicious()
    page = render_html(run, runs.all_findings(f"{runs.XSS}.py"))
    rest = body(page)
    # THEN they show as text and never as markup
    assert "<img" not in rest
    assert "</script><script>alert(2)" not in rest
    assert "&lt;img src=x onerror=alert(1)&gt;.py" in rest
    # AND strings handed to plotly (which renders some HTML) are escaped too
    for fig in figures(page).values():
        assert not any("<img" in s for s in strings(fig))
    timeline = json.dumps(figures(page)["fig-timeline"])
    assert "&lt;img src=x onerror=alert(1)&gt;Block" in timeline


def test_unknown_cost_and_evidence_keys_show_up() -> None:
    page = render_html(runs.redundant(), [runs.finding()])
    assert "a cost key nobody planned" in page
    assert "new evidence key" in page and "nested" in page
    assert "1.8 ms" in page  # redundant_time_ns_per_window, formatted by its key


def test_findings_are_cards_most_severe_first_with_highlighted_fix() -> None:
    page = render_html(runs.clean_ddp(), runs.all_findings())
    kinds = re.findall(r'<span class="pill (\w+)">\w+</span>([\w-]+)</h3>', page)
    severities = [s for s, _ in kinds]
    assert len(kinds) == len(runs.KINDS)
    assert severities == sorted(severities, key={"error": 0, "warning": 1, "info": 2}.get)
    assert page.count('<details class="card') == len(runs.KINDS) - 3  # the rest start folded
    assert '<div class="code"><pre>' in page
    assert re.search(r'<span class="k">for</span>', page)  # pygments tokens
    assert "train.py:57" in page and "train_step" in page  # source lines


def test_eight_ranks_by_hundred_windows_stays_under_5_mb() -> None:
    page = render_html(runs.medium(), [runs.finding()])
    assert len(page.encode()) < 5_000_000


def test_1024_ranks_use_heatmaps_stay_small_and_render_fast() -> None:
    run, findings = runs.huge(), runs.all_findings()
    started = time.perf_counter()
    page = render_html(run, findings)
    took = time.perf_counter() - started
    figs = figures(page)
    assert len(page.encode()) < 6_000_000
    assert took < 5.0
    assert [t["type"] for t in figs["fig-syncs"]["data"]] == ["heatmap"]
    assert figs["fig-placement"]["data"][0]["type"] == "heatmap"
    ticks = figs["fig-timeline"]["layout"]["yaxis"]["ticktext"]
    assert len(ticks) == 8 and "rank 1" in ticks  # rank 1 is the one that differs


def test_heatmap_bins_keep_the_one_rank_that_missed_a_sync() -> None:
    # GIVEN 1,024 ranks where only rank 1 misses its sync in odd windows
    fig = charts.syncs_per_window_figure(grid_of(runs.huge()))
    heat = fig["data"][0]
    assert heat["type"] == "heatmap"
    z = values(heat["z"])
    width = 50
    first_row = z[:width]
    # THEN the row holding rank 1 shows 0 syncs in odd windows, 1 in even ones
    assert first_row == [0 if w % 2 else 1 for w in range(width)]
    assert set(z[width:]) == {1}
    assert len(z) // width == charts.HEATMAP_ROWS


def test_placement_marks_extra_and_missing_syncs_per_rank() -> None:
    # GIVEN rank 1 syncing on micro-batch 0 instead of the last (4 micro-batches, 4 windows)
    fig = charts.placement_figure(grid_of(runs.divergent()))
    by_name = {t["name"]: t for t in fig["data"]}
    missing = by_name["missing sync"]
    extra = by_name["extra sync"]
    # THEN rank 1 has a missing ring at the end of each window and an extra sync at its start
    assert values(missing["y"]) == [1] * 4
    assert values(missing["x"]) == pytest.approx([w + 0.875 for w in range(4)])
    assert values(extra["x"]) == pytest.approx([w + 0.125 for w in range(4)])
    assert values(by_name["sync where it belongs"]["y"]) == [0] * 4


def test_overlap_chart_and_tile_only_with_trace_data() -> None:
    traced = render_html(runs.traced(), [])
    assert "fig-overlap" in figures(traced)
    assert "exposed communication" in traced
    plain = render_html(runs.redundant(), [])
    assert "fig-overlap" not in figures(plain)


def test_headline_counts_rank_windows_that_differ() -> None:
    head = headline(runs.huge(), [])
    assert (head.seen_syncs_min, head.seen_syncs_max) == (0, 1)
    assert head.rank_windows == 1024 * 50
    assert head.rank_windows_off == 25


def test_empty_run_renders_without_charts() -> None:
    page = render_html(Run(meta=RunMeta(), ranks=()), [])
    assert "No windows were recorded" in page
    assert figures(page) == {}


@pytest.mark.parametrize(
    ("rows", "cols", "options"),
    [
        (3, 1, {"shared_xaxes": True, "vertical_spacing": 0.07}),  # bytes, time, memory
        (2, 1, {"shared_xaxes": True, "vertical_spacing": 0.12}),  # the diff
        (1, 2, {"column_widths": [0.65, 0.35], "horizontal_spacing": 0.1}),  # overlap
        (2, 3, {}),
    ],
)
def test_subplot_grids_are_laid_out_as_plotly_lays_them_out(
    rows: int, cols: int, options: dict[str, Any]
) -> None:
    titles = [f"title {i}" for i in range(rows * cols)]
    ours = charts.subplots(rows, cols, titles, **options)
    theirs = make_subplots(rows, cols, subplot_titles=titles, **options).to_plotly_json()
    del theirs["layout"]["template"]
    assert ours == {"data": [], "layout": theirs["layout"]}


def test_figures_are_what_plotly_itself_would_serialize() -> None:
    # GIVEN every kind of figure: small and large runs, trace overlap, a diff
    pages = [
        render_html(runs.traced(), []),
        render_html(runs.divergent(), [runs.finding()]),
        render_html(runs.medium(), runs.all_findings()),
        render_html(runs.huge(), runs.all_findings()),
        render_diff_html(compare(runs.redundant(), [], runs.clean_ddp(), [])),
    ]
    seen = 0
    for page in pages:
        for name, fig in figures(page).items():
            # THEN plotly accepts each one as it is (it rejects unknown properties) and
            # writes it back unchanged: the page's JSON is the figure plotly would build
            validated = json.loads(go.Figure(fig).to_json())
            assert validated == fig, name
            assert json.loads(figure_json(fig)) == fig
            seen += 1
    assert seen == 4 * 4 + 2


def test_rendering_imports_no_plotly_python_code() -> None:
    # plotly's Python package (graph objects, validators) costs more to import than a report
    # takes to render; the page needs only its plotly.js file
    script = (
        "import sys\n"
        "from tests.helpers import runs\n"
        "from syncscope.render.diff import compare, render_diff_html\n"
        "from syncscope.render.html import render_html\n"
        "assert 'Plotly' in render_html(runs.traced(), runs.all_findings())\n"
        "render_diff_html(compare(runs.redundant(), [], runs.huge(), []))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('plotly', '_plotly_utils')))\n"
    )
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


# The command --------------------------------------------------------------------------------


@pytest.fixture
def saved_runs(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[Run, list[Finding]]]:
    """Run directories resolved to hand-built runs (the loader is tested elsewhere)."""
    table = {"before": (runs.redundant(), [runs.finding()]), "after": (runs.clean_ddp(), [])}
    monkeypatch.setattr(saved, "load_and_diagnose", lambda path: table[Path(path).name])
    return table


def test_report_command_writes_html_next_to_the_run(
    tmp_path: Path, saved_runs: object, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "before"
    run_dir.mkdir()
    assert cli.main(["report", str(run_dir)]) == 0
    assert "verdict warnings" in (run_dir / "report.html").read_text()
    out = tmp_path / "again.html"
    assert cli.main(["report", str(run_dir), "--format", "html", "-o", str(out)]) == 0
    assert out.read_text().startswith("<!doctype html>")


def test_report_command_json_and_text_to_stdout(
    tmp_path: Path, saved_runs: object, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["report", str(tmp_path / "before"), "-f", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["findings"][0]["kind"] == "redundant-sync"
    assert cli.main(["report", str(tmp_path / "before"), "-f", "text", "-o", "-"]) == 0
    assert "redundant-sync" in capsys.readouterr().out


def test_report_command_missing_directory_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["report", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("syncscope: error:") and "nope" in err and "Traceback" not in err


@pytest.mark.parametrize("make", [runs.malicious, runs.traced, runs.divergent])
def test_streamed_reports_are_the_documents_held_whole(make: Any, tmp_path: Path) -> None:
    """write_reports streams both files; they must read back as report_dict and render_html."""
    from syncscope.render.json_report import report_dict
    from syncscope.render.outputs import write_reports

    run = make()
    findings = runs.all_findings(script=f"{runs.XSS}.py")
    findings[0].evidence["odd_values"] = {3: runs.Fix("s", "t", "u"), "inf": 1e-5}
    write_reports(run, findings, tmp_path)
    as_dict = json.loads(json.dumps(report_dict(run, findings), default=str))
    assert json.loads((tmp_path / "report.json").read_bytes()) == as_dict
    assert (tmp_path / "report.html").read_text(encoding="utf-8") == render_html(run, findings)


def test_page_written_to_a_buffer_is_the_page_written_to_a_file(tmp_path: Path) -> None:
    # plotly.js is copied in pieces: the page must come out whole either way
    import io

    from syncscope.render.html import write_html

    run, findings = runs.traced(), runs.all_findings()
    buffer = io.BytesIO()
    write_html(run, findings, buffer)
    with (tmp_path / "page.html").open("wb") as out:
        out.write(b"<!-- before -->")
        write_html(run, findings, out)
        out.write(b"<!-- after -->")
    on_disk = (tmp_path / "page.html").read_bytes()
    assert on_disk == b"<!-- before -->" + buffer.getvalue() + b"<!-- after -->"
    assert buffer.getvalue().decode("utf-8") == render_html(run, findings)


@pytest.mark.parametrize(
    "text", ["", "plain", "<script>alert('x')</script>", "a & b \"c\" 'd' &amp; <>", "é ✓ \x00"]
)
def test_escape_html_is_the_standard_librarys(text: str) -> None:
    import html

    from syncscope.text import escape_html

    assert escape_html(text) == html.escape(text, quote=True)


@pytest.mark.parametrize(
    "values", [[5], [3, 1], [1, 2, 3], [4, 1, 3, 2], [0.1, 0.2, 0.3], [10**18, 1, 10**18 + 2]]
)
def test_mean_and_median_are_the_standard_librarys(values: list[float]) -> None:
    import statistics

    from syncscope.model.figures import mean, median

    assert mean(iter(values)) == statistics.fmean(values)
    assert median(iter(values)) == statistics.median(values)


def test_header_title_axes_and_legend_say_what_the_run_was() -> None:
    import dataclasses

    from syncscope.render.terminal import render_text

    # GIVEN a traced run whose last window had 2 micro-batches instead of 4
    run = runs.traced()
    ranks = []
    for r in run.ranks:
        last = r.windows[-1]
        short = dataclasses.replace(last, micro_batches=last.micro_batches[:2])
        ranks.append(dataclasses.replace(r, windows=(*r.windows[:-1], short)))
    run = dataclasses.replace(run, ranks=tuple(ranks))
    page = render_html(run, [])
    # THEN the header gives the range of micro-batches, not the common count alone
    assert "4 windows x 2-4 micro-batches" in page
    # AND the exposed-share chart ticks only on the ranks; the memory lines have a legend
    charts_ = figures(page)
    rank_axis = charts_["fig-overlap"]["layout"]["xaxis2"]
    assert rank_axis["tickmode"] == "array" and rank_axis["tickvals"] == [0, 1]
    metrics = next(f for f in charts_.values() if "Per window" in json.dumps(f["layout"]["title"]))
    assert metrics["layout"]["showlegend"] is True
    shown = [t["name"] for t in metrics["data"] if t.get("showlegend", True)]
    assert shown == ["rank 0", "rank 1"]
    # AND a report from traces is titled by what it is, not "(unknown command)"
    from_traces = dataclasses.replace(
        run, meta=dataclasses.replace(run.meta, command=(), source="trace")
    )
    assert "torch.profiler traces of 2 ranks" in render_text(from_traces, [])
    page = render_html(from_traces, [])
    assert "<title>syncscope report: torch.profiler traces of 2 ranks</title>" in page
    assert "(command not recorded)" not in body(page)


def test_trace_note_says_every_window_was_traced_when_it_was() -> None:
    from syncscope.load.combine import with_trace_overlap

    live = runs.make_run(windows=4)
    traced = runs.traced()  # the same 4 windows on 2 ranks, measured
    (note,) = with_trace_overlap(live, traced).meta.notes
    assert note == "communication overlap measured from torch.profiler traces for every window"
    import dataclasses

    half = dataclasses.replace(
        traced,
        ranks=tuple(dataclasses.replace(r, windows=r.windows[2:]) for r in traced.ranks),
    )
    (note,) = with_trace_overlap(live, half).meta.notes
    assert "for window(s) 2-3 of 4; the other windows were not traced" in note


def test_charts_number_windows_as_the_terminal_and_report_json_do(tmp_path: Path) -> None:
    """Traces number windows from the first traced step (1-2 here); every chart's
    x axis says 1-2 too, as the terminal table and report.json do, never 0-1."""
    from syncscope.analysis.diagnose import diagnose
    from syncscope.load.traces import load_traces

    root = Path(__file__).resolve().parents[3]
    run = load_traces([root / "sample_traces" / "syncscope-gloo-ddp-every"])
    assert [w.index for w in run.ranks[0].windows] == [1, 2]
    figs = figures(render_html(run, diagnose(run)))
    for name in ("fig-window-metrics", "fig-overlap", "fig-syncs"):
        for trace in figs[name]["data"]:
            if trace.get("xaxis", "x") in ("x", "x2", "x3") and name != "fig-overlap":
                assert values(trace["x"]) == [1, 2], (name, trace.get("name"))
    overlap = [t for t in figs["fig-overlap"]["data"] if t.get("xaxis", "x") == "x"]
    assert overlap and all(values(t["x"]) == [1, 2] for t in overlap)
    placement = figs["fig-placement"]
    xs = [x for t in placement["data"] for x in values(t["x"])]
    assert min(xs) > 1 and max(xs) < 3
    assert "windows 1-2 of 2" in json.dumps(figs["fig-timeline"]["layout"]["title"])


def test_per_window_charts_use_the_tiles_units_and_start_at_zero() -> None:
    """The bytes chart read 0.03 MiB where the tiles say 33.0 KiB, and the memory
    axis spanned 305.8-306 MiB, making 0.25 MiB look large."""
    import dataclasses

    run = runs.make_run(buckets=1)
    small = dataclasses.replace(  # the README example's 33.0 KiB per window
        run,
        ranks=tuple(
            dataclasses.replace(
                r,
                windows=tuple(
                    dataclasses.replace(
                        w,
                        collectives=tuple(
                            dataclasses.replace(c, bytes=33792) for c in w.collectives
                        ),
                    )
                    for w in r.windows
                ),
            )
            for r in run.ranks
        ),
    )
    cell = grid_of(small).rows[0][1]
    assert cell is not None and cell.bytes < 2**20  # KiB-sized syncs
    fig = charts.window_metrics_figure(grid_of(small))
    (bars,) = [t for t in fig["data"] if t["type"] == "bar"]
    unit = bars["name"].split()[0]
    assert unit == "KiB" and fig["layout"]["yaxis"]["title"]["text"] == "KiB"
    assert values(bars["y"])[1] == pytest.approx(cell.bytes / 1024)
    assert fig["layout"]["yaxis3"]["rangemode"] == "tozero"


def test_the_terminal_shows_sites_under_the_current_directory_relative(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The README's sample output shows ``examples/x.py:18``; the tool printed the
    absolute path. Under the current directory it prints it relative, as compilers do;
    report.json keeps the absolute path."""
    from syncscope.model import SourceLocation
    from syncscope.render.json_report import report_dict
    from syncscope.render.terminal import render_text

    script = tmp_path / "examples" / "train.py"
    site = SourceLocation(str(script), 18, "<module>")
    import dataclasses

    finding = dataclasses.replace(runs.finding(), sites=(("forward", site),))
    run = runs.redundant()
    monkeypatch.chdir(tmp_path)
    assert "forward: examples/train.py:18" in render_text(run, [finding], width=200)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert f"forward: {script}:18" in render_text(run, [finding], width=200)
    sources = report_dict(run, [finding])["findings"][0]["sources"]
    assert sources[0]["file"] == str(script)


def test_syncs_of_a_window_no_step_closed_are_not_called_extra() -> None:
    """A window no optimizer step closed has no "last micro-batch" to judge by: its
    syncs are drawn as syncs of an open window, not as extra syncs."""
    import dataclasses

    run = runs.make_run(windows=1, sync_at=runs.every)
    run = dataclasses.replace(
        run,
        ranks=tuple(
            dataclasses.replace(
                r, windows=tuple(dataclasses.replace(w, complete=False) for w in r.windows)
            )
            for r in run.ranks
        ),
    )
    by_name = {t["name"]: t for t in charts.placement_figure(grid_of(run))["data"]}
    assert "extra sync" not in by_name or not values(by_name["extra sync"]["x"])
    assert len(values(by_name["sync, window not closed by a step"]["x"])) == 2 * 4
