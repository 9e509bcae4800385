"""The timeline and overlap figures: a few windows drawn event by event, and the
communication/compute split a trace measured. Built from the run model, like charts.py."""

from __future__ import annotations

from collections.abc import Sequence

from syncscope.model import Run, Window
from syncscope.render.charts import (
    EXTRA,
    INK,
    MISSING,
    MUTED,
    OK,
    Figure,
    add_trace,
    styled,
    subplots,
    typed,
    typed2d,
    update_axes,
)
from syncscope.render.summary import Grid, window_means
from syncscope.text import escape_html

TIMELINE_RANKS = 8
TIMELINE_WINDOWS = 3


def timeline_ranks(run: Run, preferred: Sequence[int] = ()) -> list[int]:
    """Up to TIMELINE_RANKS ranks: those findings name first, then the lowest."""
    present = sorted(r.rank for r in run.ranks)
    picked = [r for r in dict.fromkeys(preferred) if r in set(present)][:TIMELINE_RANKS]
    picked += [r for r in present if r not in picked][: TIMELINE_RANKS - len(picked)]
    return sorted(picked)


# (kind of bar, hover label) -> bars: [row, start ms, length ms, window, micro-batch, MiB]
_Bars = dict[tuple[str, str], list[list[float]]]
# bar kind -> colour, width, offset; in drawing (and legend) order
_STYLES = {
    "forward + backward": (MUTED, 0.55, -0.4),
    "forward": ("#dde3ea", 0.55, -0.4),
    "backward": (MUTED, 0.55, -0.4),
    "optimizer step": (INK, 0.55, -0.4),
    "grad sync": (OK, 0.28, 0.17),
    "extra grad sync": (EXTRA, 0.28, 0.17),
    "other collective": ("#8a94a3", 0.28, 0.17),
}


def timeline_figure(run: Run, ranks: Sequence[int], first_window: int = 0) -> Figure:
    """Forward/backward, optimizer step and collectives per rank over a few windows.

    One trace per kind of bar (and per collective op and module, named in the hover), with
    numeric per-bar data (row, start, length, window, micro-batch, MiB) so the page stays small.
    """
    total = max((len(r.windows) for r in run.ranks), default=0)
    windows = range(
        first_window, min(first_window + TIMELINE_WINDOWS, max(total, first_window + 1))
    )
    bars: _Bars = {}
    for row, rank in enumerate(ranks):
        rr = run.rank(rank)
        for window in (rr.windows[w] for w in windows if rr and w < len(rr.windows)):
            _window_bars(bars, row, window)
    base = min((r.windows[0].index for r in run.ranks if r.windows), default=0)  # run numbering
    fig = styled(
        f"Timeline, window{'s' if len(windows) > 1 else ''} "
        f"{base + windows.start}{'-' + str(base + windows.stop - 1) if len(windows) > 1 else ''} "
        f"of {total}",
        120 + 46 * len(ranks),
        barmode="overlay",
        bargap=0,
    )
    _draw_bars(fig, bars)
    update_axes(fig, "x", title={"text": "ms since the first window shown"})
    update_axes(
        fig,
        "y",
        autorange="reversed",
        tickvals=list(range(len(ranks))),
        ticktext=[f"rank {r}" for r in ranks],
        range=[len(ranks) - 0.5, -0.5],
    )
    return fig


def _window_bars(bars: _Bars, row: int, window: Window) -> None:
    """The bars of one rank's window, on row ``row``."""

    def add(kind: str, label: str, start: int, end: int, m: int, nbytes: int = 0) -> None:
        bars.setdefault((kind, label), []).append(
            [row, start / 1e6, max(end - start, 1) / 1e6, w, m, nbytes / 2**20]
        )

    w = window.index
    last = len(window.micro_batches) - 1 if window.complete else None
    for mb in window.micro_batches:
        split = getattr(mb, "backward_start_ns", None)  # present once capture records it
        if isinstance(split, int) and mb.start_ns <= split <= mb.end_ns:
            add("forward", "", mb.start_ns, split, mb.index)
            add("backward", "", split, mb.end_ns, mb.index)
        else:
            add("forward + backward", "", mb.start_ns, mb.end_ns, mb.index)
    if window.step_ns:
        add("optimizer step", "", window.end_ns - window.step_ns, window.end_ns, last or 0)
    for c in window.collectives:
        kind = "other collective"
        if c.grad_sync:
            kind = "grad sync" if c.micro_batch == last else "extra grad sync"
        label = escape_html(f"{c.op} ({c.raw_op}), {c.phase}")
        label += f"<br>{escape_html(c.module)}" if c.module else ""
        add(kind, label, c.start_ns, c.start_ns + c.duration_ns, c.micro_batch, c.bytes)


def _draw_bars(fig: Figure, bars: _Bars) -> None:
    """One bar trace per (kind, label), kinds in ``_STYLES`` order, each kind once in the legend."""
    origin = min((b[1] for rows in bars.values() for b in rows), default=0.0)
    shown: set[str] = set()
    for kind, (color, width, offset) in _STYLES.items():
        for (k, label), rows in bars.items():
            if k != kind:
                continue
            size = "<br>%{customdata[2]:.2f} MiB" if k.endswith("collective") or "sync" in k else ""
            add_trace(
                fig,
                "bar",
                y=typed([b[0] for b in rows], "i2"),
                base=typed([b[1] - origin for b in rows]),
                x=typed([b[2] for b in rows]),
                customdata=typed2d([b[3:] for b in rows]),
                orientation="h",
                name=kind,
                legendgroup=kind,
                showlegend=kind not in shown,
                marker={"color": color, "line": {"width": 0}},
                width=width,
                offset=offset,
                hovertemplate=(f"{label}<br>" if label else "")
                + "window %{customdata[0]}, micro-batch %{customdata[1]}"
                + size
                + "<br>%{base:.2f} ms + %{x:.3f} ms<extra>"
                + kind
                + "</extra>",
            )
            shown.add(kind)


def overlap_figure(grid: Grid) -> Figure:
    """Compute, overlapped and exposed communication per window, and exposed share per rank."""
    fig = subplots(
        1,
        2,
        ("per window, mean over ranks (ms)", "exposed share of window time, per rank"),
        column_widths=[0.65, 0.35],
        horizontal_spacing=0.1,
    )
    styled("Communication overlap (from the trace)", 380, fig, top=100, barmode="stack")
    x = typed(grid.window_numbers, "i4")
    compute, comm, exposed = (
        window_means(grid, a) for a in ("compute_ns", "comm_ns", "exposed_comm_ns")
    )
    hidden = [
        None if c is None or e is None else (c - e) for c, e in zip(comm, exposed, strict=True)
    ]
    for label, values, color in (
        ("compute", compute, MUTED),
        ("overlapped comm", hidden, "#7fbfa0"),
        ("exposed comm", exposed, MISSING),
    ):
        add_trace(
            fig,
            "bar",
            1,
            x=x,
            y=typed([None if v is None else v / 1e6 for v in values]),
            name=label,
            marker={"color": color},
            hovertemplate="window %{x}: %{y:.2f} ms<extra>" + label + "</extra>",
        )
    shares: list[float | None] = []
    for row in grid.rows:
        cells = [c for c in row if c is not None and c.exposed_comm_ns is not None]
        total = sum(c.duration_ns for c in cells)
        shares.append(sum(c.exposed_comm_ns or 0 for c in cells) / total if total else None)
    add_trace(
        fig,
        "bar",
        2,
        x=typed(grid.ranks, "i4"),
        y=typed(shares),
        marker={"color": MISSING},
        showlegend=False,
        hovertemplate="rank %{x}: %{y:.1%} exposed<extra></extra>",
    )
    update_axes(fig, "y", 2, tickformat=".0%", rangemode="tozero")
    update_axes(fig, "x", 1, title={"text": "window"})
    # ranks are integers: ticks on the ranks only, never at -0.5, 0.5, ...
    ticks: dict[str, object] = (
        {"tickmode": "array", "tickvals": list(grid.ranks)}
        if len(grid.ranks) <= 32
        else {"tickformat": "d"}
    )
    update_axes(fig, "x", 2, title={"text": "rank"}, **ticks)
    return fig
