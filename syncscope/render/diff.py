"""Before/after comparison of two runs: ``compare`` builds a ``RunDiff`` from the model and the
findings; ``render_diff_text`` (rich, for the terminal) and ``render_diff_html`` show it.

Findings are matched by ``(kind, cause)``: the same problem seen in both runs persists, one
only in the first is resolved, one only in the second is new.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.table import Table

from syncscope.model import Finding, Run, Verdict
from syncscope.model.figures import Stat, window_time, within_noise
from syncscope.render.charts import (
    ACCENT,
    MUTED,
    Figure,
    add_trace,
    styled,
    subplots,
    typed,
    update_axes,
)
from syncscope.render.html import finding_card
from syncscope.render.page import esc, figure_block, page, section
from syncscope.render.summary import (
    Grid,
    Headline,
    grid_of,
    headline,
    window_means,
)
from syncscope.render.terminal import SafeConsole, VisibleText
from syncscope.text import human_bytes, human_ns

Unit = Literal["count", "bytes", "ns"]
Change = Literal["better", "worse", "same", "within noise", "n/a"]


@dataclass(frozen=True)
class MetricChange:
    label: str
    before: float | None
    after: float | None
    unit: Unit
    target: float | None = None  # better means closer to this; None: lower is better
    # each run's spread over its windows (median, low, high): a change inside it is noise
    spread: tuple[Stat | None, Stat | None] = (None, None)

    @property
    def change(self) -> Change:
        if self.before is None or self.after is None:
            return "n/a"
        a, b = self.spread
        timed = self.unit == "ns" and a is not None and b is not None
        if (
            timed
            and a is not None
            and b is not None
            and within_noise(a, b)
            and a.median != b.median
        ):
            return "within noise"
        if self.target is not None:
            old, new = abs(self.before - self.target), abs(self.after - self.target)
        else:
            old, new = self.before, self.after
        if abs(new - old) <= 1e-9 + 0.01 * abs(old):  # within 1%: noise, not a change
            return "same"
        return "better" if new < old else "worse"

    def show(self, value: float | None, which: int = -1) -> str:
        if value is None:
            return "not measured"
        stat = self.spread[which] if which in (0, 1) else None
        if self.unit == "count" and stat is not None:  # counts: the range seen, never a mean
            low, high = int(stat.low), int(stat.high)
            return f"{low}" if low == high else f"{low}-{high}"
        if self.unit == "bytes":
            return human_bytes(value)
        if self.unit == "ns":
            if stat is not None and stat.high - stat.low >= 0.05 * max(stat.median, 1.0):
                return f"{human_ns(value)} ({human_ns(stat.low)}-{human_ns(stat.high)})"
            return human_ns(value)
        return f"{value:.3g}"

    @property
    def delta(self) -> str:
        if self.before is None or self.after is None:
            return ""
        if self.before and self.unit != "count":
            return f"{(self.after - self.before) / self.before * 100:+.0f}%"
        return f"{self.after - self.before:+.3g}"


@dataclass(frozen=True)
class RunDiff:
    labels: tuple[str, str]
    before: Headline
    after: Headline
    grids: tuple[Grid, Grid]
    metrics: tuple[MetricChange, ...]
    resolved: tuple[Finding, ...]
    new: tuple[Finding, ...]
    persisting: tuple[Finding, ...]  # as seen in the second run

    @property
    def failed(self) -> tuple[str, ...]:
        """Labels of the runs that failed (did not run to their end)."""
        return tuple(
            label
            for label, head in zip(self.labels, (self.before, self.after), strict=True)
            if head.verdict == "failed"
        )

    @property
    def speedup(self) -> float | None:
        """Window-time ratio, before over after (2.0: the second run's windows take half).
        None when either run failed: a run that stopped early is no baseline or result."""
        if self.failed or not self.before.window_ns or not self.after.window_ns:
            return None
        return self.before.window_ns / self.after.window_ns

    @property
    def tone(self) -> Verdict:
        if self.failed:
            return "failed"
        if any(f.severity == "error" for f in self.new):
            return "errors"
        if self.after.verdict in ("errors", "incomplete"):
            return self.after.verdict
        if any(f.severity == "warning" for f in self.new) or self.after.verdict != "clean":
            return "warnings"
        return "clean"

    @property
    def _window_metric(self) -> MetricChange | None:
        return next((m for m in self.metrics if m.label.startswith("window time")), None)

    @property
    def title(self) -> str:
        parts = []
        if self.resolved:
            parts.append(f"{len(self.resolved)} finding{_s(self.resolved)} resolved")
        if self.new:
            parts.append(f"{len(self.new)} new")
        if self.persisting:
            parts.append(f"{len(self.persisting)} still present")
        text = ", ".join(parts) if parts else "No findings in either run"
        if self.failed:
            which = " and ".join(self.failed)
            runs = "both runs" if len(self.failed) == 2 else which
            text = f"{'Both runs' if len(self.failed) == 2 else 'Run ' + which} failed; " + text
            text += f" (only the complete windows of {runs} are compared)"
        return text

    @property
    def subtitle(self) -> str:
        a, b = self.before, self.after
        syncs, window = self.metrics[0], self._window_metric
        line = (
            f"grad syncs per window {syncs.show(syncs.before, 0)} -> "
            f"{syncs.show(syncs.after, 1)} (expected {b.expected_syncs_per_window:.3g}); "
            f"window time {human_ns(a.window_ns)} -> {human_ns(b.window_ns)}"
        )
        if window is not None and window.change == "within noise" and not self.failed:
            x, y = window.spread
            assert x is not None and y is not None
            line += (
                f" (within noise: windows {human_ns(x.low)}-{human_ns(x.high)} -> "
                f"{human_ns(y.low)}-{human_ns(y.high)})"
            )
        elif self.speedup and abs(self.speedup - 1) >= 0.01:
            line += f" ({self.speedup:.2f}x {'faster' if self.speedup > 1 else 'as fast'})"
        elif self.failed:
            line += " (no speed-up claimed: a failed run is not a fair comparison)"
        return line


def _s(items: Sequence[object]) -> str:
    return "" if len(items) == 1 else "s"


def compare(
    run_a: Run,
    findings_a: Sequence[Finding],
    run_b: Run,
    findings_b: Sequence[Finding],
    labels: tuple[str, str] = ("before", "after"),
) -> RunDiff:
    grid_a, grid_b = grid_of(run_a), grid_of(run_b)
    a, b = headline(run_a, findings_a, grid_a), headline(run_b, findings_b, grid_b)
    syncs = (
        Stat(a.seen_syncs_per_window, a.seen_syncs_min, a.seen_syncs_max, a.rank_windows),
        Stat(b.seen_syncs_per_window, b.seen_syncs_min, b.seen_syncs_max, b.rank_windows),
    )
    metrics = (
        MetricChange(
            "grad syncs per window",
            a.seen_syncs_per_window,
            b.seen_syncs_per_window,
            "count",
            target=b.expected_syncs_per_window,
            spread=syncs,
        ),
        MetricChange(
            "grad sync bytes per window",
            a.grad_sync_bytes_per_window,
            b.grad_sync_bytes_per_window,
            "bytes",
        ),
        MetricChange(
            "window time (median, steady windows)",
            a.window_ns,
            b.window_ns,
            "ns",
            spread=(window_time(run_a), window_time(run_b)),
        ),
        MetricChange("comm time (collective in flight)", a.comm_ns, b.comm_ns, "ns"),
        MetricChange("peak memory", a.peak_memory_bytes, b.peak_memory_bytes, "bytes"),
        MetricChange(
            "exposed communication per window",
            _exposed_per_window(grid_a),
            _exposed_per_window(grid_b),
            "ns",
        ),
    )
    keys_a = {(f.kind, f.cause) for f in findings_a}
    keys_b = {(f.kind, f.cause) for f in findings_b}
    return RunDiff(
        labels=labels,
        before=a,
        after=b,
        grids=(grid_a, grid_b),
        metrics=tuple(m for m in metrics if m.before is not None or m.after is not None),
        resolved=tuple(f for f in findings_a if (f.kind, f.cause) not in keys_b),
        new=tuple(f for f in findings_b if (f.kind, f.cause) not in keys_a),
        persisting=tuple(f for f in findings_b if (f.kind, f.cause) in keys_a),
    )


def _exposed_per_window(grid: Grid) -> float | None:
    values = [c.exposed_comm_ns for c in grid.cells() if c.exposed_comm_ns is not None]
    return sum(values) / len(values) if values else None


def diff_figure(a: Grid, b: Grid, labels: tuple[str, str] = ("before", "after")) -> Figure:
    """Grad syncs and window time per window, before against after."""
    fig = subplots(
        2,
        1,
        ("grad syncs per window (mean over ranks)", "window time (ms)"),
        shared_xaxes=True,
        vertical_spacing=0.12,
    )
    styled("Before and after, window by window", 460, fig, top=100)
    for grid, label, color in ((a, labels[0], MUTED), (b, labels[1], ACCENT)):
        x = typed(grid.window_numbers, "i4")
        syncs = window_means(grid, "syncs")
        ms = [None if v is None else v / 1e6 for v in window_means(grid, "duration_ns")]
        add_trace(
            fig,
            "scatter",
            1,
            x=x,
            y=typed(syncs),
            name=label,
            mode="lines",
            line={"color": color, "width": 3},
            legendgroup=label,
        )
        add_trace(
            fig,
            "scatter",
            2,
            x=x,
            y=typed(ms),
            name=label,
            mode="lines",
            line={"color": color, "width": 3},
            legendgroup=label,
            showlegend=False,
        )
    update_axes(fig, "y", rangemode="tozero")
    update_axes(fig, "x", 2, title={"text": "window"})
    if max(a.windows, b.windows) <= 20:
        update_axes(fig, "x", dtick=1)
    return fig


STYLES = {"better": "green", "worse": "red", "same": "dim", "within noise": "dim", "n/a": "dim"}
TONES = {
    "clean": "green",
    "warnings": "yellow",
    "incomplete": "yellow",
    "errors": "red",
    "failed": "bold red",
}


def render_diff_text(diff: RunDiff, *, color: bool = False, width: int = 100) -> str:
    """The comparison for a terminal; ``color`` adds ANSI styles (for a tty)."""
    out = io.StringIO()
    console = SafeConsole(
        file=out,
        width=width,
        force_terminal=color,
        no_color=not color,
        highlight=False,
        emoji=False,
    )
    console.print(
        VisibleText(f"syncscope diff: {diff.labels[0]} -> {diff.labels[1]}", style="bold")
    )
    console.print(VisibleText(diff.title, style=f"bold {TONES[diff.tone]}"))
    console.print(VisibleText(diff.subtitle))
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    table.add_column("metric")
    table.add_column(diff.labels[0], justify="right")
    table.add_column(diff.labels[1], justify="right")
    table.add_column("change", justify="right")
    for m in diff.metrics:
        table.add_row(
            m.label,
            m.show(m.before, 0),
            m.show(m.after, 1),
            VisibleText(f"{m.delta} {m.change}".strip(), style=STYLES[m.change]),
        )
    console.print()
    console.print(table)
    for title, findings, mark, style in (
        ("resolved", diff.resolved, "+", "green"),
        ("new", diff.new, "!", "red"),
        ("still present", diff.persisting, "-", "yellow"),
    ):
        if findings:
            console.print()
            console.print(VisibleText(f"{title} ({len(findings)})", style="bold"))
            for f in findings:
                line = VisibleText(f"  {mark} ", style=style)
                line.append(f"{f.kind} [{f.severity}] ", style="bold")
                line.append(f.message)  # Text: run strings are never parsed as markup
                console.print(line)
    return out.getvalue()


def render_diff_html(diff: RunDiff) -> str:
    a, b = diff.labels
    rows = "".join(
        f"<tr><td>{esc(m.label)}</td><td>{esc(m.show(m.before, 0))}</td><td>{esc(m.show(m.after, 1))}</td>"
        f'<td class="{esc(m.change)}">{esc(m.delta)} {esc(m.change)}</td></tr>'
        for m in diff.metrics
    )
    table = (
        f'<table class="diff" id="metrics"><thead><tr><th>metric</th><th>{esc(a)}</th>'
        f"<th>{esc(b)}</th><th>change</th></tr></thead><tbody>{rows}</tbody></table>"
    )
    parts = [
        f'<header class="top"><span class="brand">syncscope diff</span>'
        f'<code class="cmd">{esc(a)} -> {esc(b)}</code></header>',
        f'<div class="verdict {esc(diff.tone)}" id="verdict"><h1>{esc(diff.title)}</h1>'
        f"<p>{esc(diff.subtitle)}</p></div>",
        section("Headline numbers", "", [table], section_id="numbers"),
    ]
    if diff.grids[0].windows or diff.grids[1].windows:
        parts.append(
            section(
                "Window by window",
                "",
                [figure_block(diff_figure(*diff.grids, labels=diff.labels), "fig-diff")],
            )
        )
    for title, lead, findings in (
        ("New findings", f"Seen in {b}, not in {a}.", diff.new),
        ("Still present", f"Seen in both; as in {b}.", diff.persisting),
        ("Resolved", f"Seen in {a}, gone in {b}.", diff.resolved),
    ):
        if findings:
            cards = [
                finding_card(f, f"{title.split()[0].lower()}-{i}") for i, f in enumerate(findings)
            ]
            parts.append(section(f"{title} ({len(findings)})", lead, cards))
    return page(f"syncscope diff: {a} -> {b}", "\n".join(parts))
