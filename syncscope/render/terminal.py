"""The terminal summary (rich): window shapes, findings with their fixes, and a verdict."""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text

from syncscope import text as units
from syncscope.model import (
    SEVERITIES,
    Finding,
    RankRun,
    Run,
    SourceLocation,
    Window,
    compress_ranks,
    figures,
    verdict_of,
)
from syncscope.model.figures import median
from syncscope.model.per_model import wrapped_models
from syncscope.render.summary import (
    frameworks_of,
    headline,
    hta_lines,
    human_value,
    label_of,
    plain_text,
    title_of,
    window_basis,
    window_time_text,
)
from syncscope.text import human_bytes, visible


class VisibleText(Text):
    """Rich text whose strings show their control characters (``syncscope.text.visible``)
    before layout: the width rich measures is the width printed, and rich does not drop a
    BEL or a carriage return it would strip."""

    def __init__(self, text: str = "", style: str = "") -> None:
        super().__init__(visible(text), style=style)

    def append(self, text: str | Text, style: str | Style | None = None) -> VisibleText:
        super().append(visible(text) if isinstance(text, str) else text, style=style)
        return self


def human_ns(ns: float | None) -> str:
    """A duration as the terminal shows it: below a millisecond, in whole µs."""
    return units.human_ns(ns, whole_us=True)


SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
VERDICT_STYLE = {
    "failed": "bold white on dark_red",
    "errors": "bold white on red",
    "incomplete": "bold black on yellow",
    "warnings": "bold black on yellow",
    "clean": "bold white on green",
}


def _shape(w: Window, apart: frozenset[int] = frozenset()) -> tuple[object, ...]:
    return (
        w.complete,
        len(w.micro_batches),
        w.grad_syncs,
        tuple(w.grad_sync_micro_batches),
        w.index in apart,
    )


def _runs_of_windows(rank: RankRun, apart: frozenset[int] = frozenset()) -> list[list[Window]]:
    """Consecutive windows of the same shape, so 1,000 identical windows are one row
    (warm-up windows, shown apart from the steady ones, get rows of their own)."""
    groups: list[list[Window]] = []
    for w in rank.windows:
        if groups and _shape(groups[-1][-1], apart) == _shape(w, apart):
            groups[-1].append(w)
        else:
            groups.append([w])
    return groups


def _rank_signature(rank: RankRun, apart: frozenset[int]) -> tuple[tuple[object, ...], ...]:
    return tuple(_shape(w, apart) for w in rank.windows)


def _expected_title(run: Run) -> str:
    """What one window should hold: one grad sync, or one per model where a rank steps
    several DDP models (each judged on its own)."""
    models = max((len(wrapped_models(rank)) for rank in run.ranks), default=0)
    if models >= 2:
        return (
            f"Gradient syncs per window (expected: 1 per model, {models} models, "
            "each on its last micro-batch)"
        )
    return "Gradient syncs per window (expected: 1, on the last micro-batch)"


def window_table(run: Run) -> Table:
    table = Table(
        title=_expected_title(run),
        title_justify="left",
        expand=False,
    )
    for name in ("ranks", "windows"):
        table.add_column(name, justify="left")
    for name in (
        "micro-batches",
        "grad syncs",
        "at micro-batch",
        "sync bytes",
        "comm time",
        "window time",
    ):
        table.add_column(name, justify="right")
    apart = frozenset(i for i, _ in figures.steady_windows(run).warmup)
    by_signature: dict[tuple[tuple[object, ...], ...], list[RankRun]] = {}
    for r in run.ranks:
        by_signature.setdefault(_rank_signature(r, apart), []).append(r)
    for ranks in by_signature.values():
        label = compress_ranks([r.rank for r in ranks])
        for group in _runs_of_windows(ranks[0], apart):
            first, last = group[0], group[-1]
            windows = str(first.index) if first is last else f"{first.index}-{last.index}"
            if not first.complete:
                windows += " (incomplete)"
            elif first.index in apart:
                windows += " (warm-up)"
            # the same figures as everywhere (syncscope.model.figures), median over this row's ranks
            # and windows: comm time is the union of time with a collective in flight
            indices = {w.index for w in group}
            cells = [w for r in ranks for w in r.windows if w.index in indices]
            syncs = first.grad_syncs
            expected = 1 if first.micro_batches else 0
            style = "green" if syncs == expected or not first.complete else "red"
            table.add_row(
                label,
                windows,
                str(len(first.micro_batches)),
                VisibleText(str(syncs), style=style),
                ",".join(map(str, first.grad_sync_micro_batches)) or "-",
                human_bytes(median(w.grad_sync_bytes for w in cells)),
                human_ns(median(figures.comm_ns(w) for w in cells)),
                human_ns(median(w.duration_ns for w in cells)),
            )
    return table


def figures_line(run: Run, findings: Sequence[Finding]) -> Text:
    """The headline figures, as the HTML report and ``diff`` show them."""
    head = headline(run, findings)
    line = VisibleText()
    line.append("window time ", style="bold")
    line.append(f"{window_time_text(head)} ({window_basis(head)})")
    if head.comm_ns is not None:
        line.append("\ncomm time ", style="bold")
        line.append(f"{human_ns(head.comm_ns)} (a collective in flight, union per window)")
    line.append("\npeak memory ", style="bold")
    line.append(
        "not measured"
        if head.peak_memory_bytes is None
        else f"{human_bytes(head.peak_memory_bytes)} (highest on any rank)"
    )
    p = head.projection
    if p is not None:
        line.append("\nprojected speed-up ", style="bold")
        if p.shown:
            line.append(
                f"{p.text()}: window {human_ns(head.baseline_window_ns or 0)} -> "
                f"~{human_ns(head.projected_window_ns or 0)}; basis: {p.basis}"
            )
        else:
            line.append(f"not projected: {p.omitted}")
    return line


def _num(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def _fragment_cost(c: dict[str, object]) -> str:
    """fragmented-sync: the estimate from the figures shown beside it."""
    overhead = f"~{human_ns(_num(c['estimated_latency_overhead_ns_per_window']))}"
    if "extra_collectives_per_window" not in c:  # a report from before these figures
        return f"{overhead} of per-call latency per window"
    return (
        f"{_num(c['extra_collectives_per_window']):.0f} extra collectives x "
        f"{human_ns(_num(c['collective_call_ns']))} per call = {overhead} per window "
        f"({_num(c['share_of_window_time']):.0%} of the {human_ns(_num(c['window_ns']))} window)"
    )


def _memory_cost(value: object, what: str, per: str = "") -> str:
    """``skipping would hold ~4.1 KiB more gradient memory``; an unknown amount (a trace
    records no parameter sizes) said so, never ~0 B."""
    if value is None:
        return f"{what} more gradient memory{per}: unknown (no parameter sizes recorded)"
    return f"{what} ~{human_bytes(_num(value))} more gradient memory{per}"


def _cost_line(f: Finding) -> str:
    parts = []
    c = f.cost
    if "wasted_bytes_per_window" in c:
        parts.append(f"{human_bytes(_num(c['wasted_bytes_per_window']))} wasted per window")
    if "redundant_time_ns_per_window" in c:
        share = _num(c.get("share_of_window_time", 0.0))
        parts.append(
            f"{human_ns(_num(c['redundant_time_ns_per_window']))} of exposed sync time before "
            f"the last micro-batch ({share:.0%} of window time)"
        )
    if "reduced_twice_time_ns_per_window" in c:
        share = _num(c.get("share_of_window_time", 0.0))
        parts.append(
            f"{human_ns(_num(c['reduced_twice_time_ns_per_window']))} in the second reduction "
            f"({share:.0%} of window time)"
        )
    if "projection_omitted" in c:
        parts.append(f"window time not projected: {c['projection_omitted']}")
    elif "projected_window_ns" in c and "window_ns" in c:
        parts.append(
            f"window {human_ns(_num(c['window_ns']))} -> ~{human_ns(_num(c['projected_window_ns']))} after the fix"
        )
    if "extra_memory_bytes_if_skipped" in c:
        parts.append(_memory_cost(c["extra_memory_bytes_if_skipped"], "skipping would hold"))
    if "extra_memory_bytes_if_gradient_sync_skipped" in c:
        parts.append(
            _memory_cost(
                c["extra_memory_bytes_if_gradient_sync_skipped"],
                "set_requires_gradient_sync instead would hold",
                " per rank",
            )
        )
    if "estimated_extra_memory_bytes" in c:
        parts.append(
            f"~{human_bytes(_num(c['estimated_extra_memory_bytes']))} extra gradient memory held"
        )
    if "estimated_latency_overhead_ns_per_window" in c:
        parts.append(_fragment_cost(c))
    if "lost_share_of_gradient" in c:
        parts.append(f"{_num(c['lost_share_of_gradient']):.0%} of the window's gradient lost")
    return "; ".join(parts)


def site_text(site: SourceLocation) -> str:
    """``examples/train.py:18``: a path under the current directory relative to it, as a
    compiler prints it (report.json keeps the absolute path; report.html shows this)."""
    try:
        path = Path(site.file)
        if path.is_absolute():
            return f"{path.relative_to(Path.cwd())}:{site.line}"
    except (ValueError, OSError):  # elsewhere, or no current directory
        pass
    return str(site)


def finding_panel(f: Finding) -> Panel:
    body: list[RenderableType] = [VisibleText(f.message)]
    where = f"ranks {compress_ranks(f.ranks)}" if f.ranks else ""
    if f.windows:
        where += f", windows {compress_ranks(f.windows)}"
    if where:
        body.append(VisibleText(where, style="dim"))
    evidence = {k: v for k, v in f.evidence.items() if not isinstance(v, dict)}
    if evidence:
        body.append(
            VisibleText(
                "evidence: "
                + ", ".join(f"{label_of(k)} {human_value(k, v)}" for k, v in evidence.items())
            )
        )
    for key, value in f.evidence.items():
        if key == "hta":
            body.append(VisibleText("HTA (Holistic Trace Analysis):"))
            body.extend(VisibleText(f"  {line}") for line in hta_lines(value))
        elif isinstance(value, dict):
            body.append(VisibleText(f"{key}:"))
            for k, v in list(value.items())[:8]:
                body.append(VisibleText(f"  {k}: {human_value(str(k), v)}"))
    cost = _cost_line(f)
    if cost:
        body.append(VisibleText("cost: " + cost, style="bold"))
    for role, site in f.sites:
        body.append(VisibleText(f"{role}: {site_text(site)}", style="dim"))
    if f.fix is not None:
        body.append(VisibleText("fix: " + plain_text(f.fix.summary), style="green"))
        language = "diff" if f.fix.diff else "python"  # fix's own rewrite, or the form to write
        from rich.syntax import Syntax  # pygments: imported by a summary that shows a fix only

        body.append(Syntax(f.fix.snippet, language, theme="ansi_dark", background_color="default"))
    title = f"[{SEVERITY_STYLE[f.severity]}]{f.severity}[/] {f.kind} ({f.cause})"
    return Panel(
        Group(*body), title=title, title_align="left", border_style=SEVERITY_STYLE[f.severity]
    )


def summary_renderables(run: Run, findings: Sequence[Finding]) -> list[RenderableType]:
    out: list[RenderableType] = []
    meta = run.meta
    head = VisibleText()
    head.append("syncscope ", style="bold")
    head.append(title_of(run) or "(command not recorded)")
    framework = frameworks_of(run)
    framework = f"  ·  {framework}" if framework else ""
    head.append(
        f"  ·  world size {meta.world_size}{framework}  ·  source {meta.source}", style="dim"
    )
    out.append(head)
    for note in meta.notes:
        out.append(VisibleText(f"note: {note}", style="yellow"))
    if run.ranks and any(r.windows for r in run.ranks):
        out.append(window_table(run))
        out.append(figures_line(run, findings))
    else:
        out.append(VisibleText("no optimizer step or backward pass was recorded", style="yellow"))
    for f in findings:
        out.append(finding_panel(f))
    verdict = verdict_of(list(findings))
    counts = {s: sum(f.severity == s for f in findings) for s in SEVERITIES}
    line = VisibleText(f" verdict: {verdict} ", style=VERDICT_STYLE[verdict])
    line.append("  " + ", ".join(f"{n} {s}{'s' if n != 1 else ''}" for s, n in counts.items()))
    if verdict == "failed":
        complete = [sum(1 for w in r.windows if w.complete) for r in run.ranks]
        low, high = min(complete, default=0), max(complete, default=0)
        shown = f"{low}" if low == high else f"{low}-{high}"
        line.append(
            f"  (the script did not run to its end; still measured: {shown} complete "
            f"window{'s' if high != 1 else ''} on {len(run.ranks)} rank"
            f"{'s' if len(run.ranks) != 1 else ''})"
        )
    out.append(line)
    return out


class SafeConsole(Console):
    """A rich Console that shows the control characters of every text it renders. Styles are
    applied after, from each segment's style: syncscope's colours still work; a user's
    escape sequences come out as text."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment if segment.control else Segment(visible(segment.text), segment.style)
            for segment in buffer
        )


def print_summary(run: Run, findings: Sequence[Finding], console: Console | None = None) -> None:
    if console is None:
        console = SafeConsole()
        if not console.is_terminal:
            console = SafeConsole(width=120)
    for item in summary_renderables(run, findings):
        console.print(item)


def render_text(run: Run, findings: Sequence[Finding], width: int = 110) -> str:
    console = SafeConsole(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    print_summary(run, findings, console)
    out = console.file
    assert isinstance(out, io.StringIO)
    return out.getvalue()


def write_text(run: Run, findings: Sequence[Finding], out: IO[bytes]) -> None:
    """``render_text`` as the ``text`` output format (see render/outputs.py)."""
    out.write(render_text(run, findings).encode("utf-8"))
