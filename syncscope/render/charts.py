"""Plotly figures built from the run model. Analysis code never plots; these functions do.

Every builder takes model objects (or the ``summary.Grid`` built from them) and returns a
``Figure``: the plain ``{"data": [...], "layout": {...}}`` dict that ``Plotly.newPlot`` takes,
built directly rather than through ``plotly.graph_objects`` (whose import and validation cost
more than the rest of a report). ``subplots`` lays out a grid of axes the way plotly's
``make_subplots`` does. Arrays go in as typed-array specs (``{"dtype", "bdata"}``), which
keeps a 1,024-rank page small. Strings that come from a run (module and op names) are
HTML-escaped before they reach plotly, which renders a subset of HTML in labels.
"""

from __future__ import annotations

import array
import base64
import sys
from collections.abc import Sequence
from typing import Any

from syncscope.render.summary import Grid, window_means
from syncscope.text import bytes_unit, escape_html

OK = "#2f9e6e"  # synced where it belongs
EXTRA = "#e8a33d"  # an extra sync
MISSING = "#d64545"  # an expected sync that never happened
MUTED = "#c9ced6"
INK = "#1f2933"
ACCENT = "#3b6fd1"
RANK_COLORS = (
    "#3b6fd1",
    "#7a9cdf",
    "#1d3f86",
    "#9fb4d8",
    "#5a7fc4",
    "#27508f",
    "#b9c8e6",
    "#4a5f8a",
)
PLACEMENT_WINDOWS_SHOWN = 16  # initial x range; the rest is a pan away
HEATMAP_ROWS = 128  # rank rows drawn at most; more ranks share a row

_TYPECODES = {"u1": "B", "i2": "h", "u2": "H", "i4": "i", "f4": "f", "f8": "d"}
AXIS_STYLE: dict[str, Any] = {"gridcolor": "#eef0f3", "zeroline": False, "linecolor": "#d5d9df"}

Figure = dict[str, Any]
"""A plotly figure as JSON-ready dicts: ``{"data": [trace, ...], "layout": {...}}``."""


def smallest_dtype(values: Sequence[float | None]) -> str:
    """u1 or u2 for small non-negative integers (a 1,024 x 50 heatmap in 70 KB), else f4."""
    top = 0
    for v in values:
        if not isinstance(v, int) or v < 0:
            return "f4"
        top = max(top, v)
    return "u1" if top <= 0xFF else "u2" if top <= 0xFFFF else "f4"


def typed(values: Sequence[float | None], dtype: str = "f8") -> dict[str, str]:
    """A plotly typed-array spec; None becomes NaN (only for float dtypes)."""
    data = array.array(_TYPECODES[dtype], [float("nan") if v is None else v for v in values])
    if sys.byteorder != "little":
        data.byteswap()
    return {"dtype": dtype, "bdata": base64.b64encode(data.tobytes()).decode("ascii")}


def typed2d(rows: Sequence[Sequence[float | None]], dtype: str = "f4") -> dict[str, str]:
    spec = typed([v for row in rows for v in row], dtype)
    spec["shape"] = f"{len(rows)}, {len(rows[0]) if rows else 0}"
    return spec


def _axis(letter: str, cell: int) -> str:
    """The layout key of subplot ``cell``'s x or y axis: xaxis, xaxis2, ..."""
    return f"{letter}axis{cell if cell > 1 else ''}"


def subplots(
    rows: int,
    cols: int,
    titles: Sequence[str],
    *,
    shared_xaxes: bool = False,
    vertical_spacing: float | None = None,
    horizontal_spacing: float | None = None,
    column_widths: Sequence[float] | None = None,
) -> Figure:
    """A grid of x/y axes laid out as plotly's ``make_subplots`` does: the same domains, cells
    numbered row by row from the top left (cell 1 on xaxis/yaxis, cell 2 on xaxis2/yaxis2, ...),
    a title above each cell, shared x axes matching the bottom row's and unlabelled above it."""
    hs = 0.2 / cols if horizontal_spacing is None else horizontal_spacing
    vs = 0.5 / rows if vertical_spacing is None else vertical_spacing
    if column_widths is None:
        widths = [(1.0 - hs * (cols - 1)) / cols] * cols
    else:
        widths = [(1.0 - hs * (cols - 1)) * (w / float(sum(column_widths))) for w in column_widths]
    heights = [(1.0 - vs * (rows - 1)) / rows] * rows
    layout: dict[str, Any] = {}
    annotations: list[dict[str, Any]] = []
    for r in range(rows):  # from the top
        below = rows - 1 - r
        y0 = sum(heights[:below]) + below * vs
        # clamped to [0, 1] against float noise, as make_subplots does
        y_domain = [min(max(y0, 0.0), 1.0), min(max(y0 + heights[below], 0.0), 1.0)]
        for c in range(cols):
            cell = r * cols + c + 1
            x0 = sum(widths[:c]) + c * hs
            x_domain = [x0, x0 + widths[c]]
            suffix = str(cell) if cell > 1 else ""
            x_axis: dict[str, Any] = {"domain": x_domain, "anchor": "y" + suffix}
            if shared_xaxes and below:
                x_axis |= {"matches": f"x{(rows - 1) * cols + c + 1}", "showticklabels": False}
            layout[_axis("x", cell)] = x_axis
            layout[_axis("y", cell)] = {"domain": y_domain, "anchor": "x" + suffix}
            if cell <= len(titles) and titles[cell - 1]:
                annotations.append(
                    {
                        "y": y_domain[1],
                        "xref": "paper",
                        "x": sum(x_domain) / 2.0,
                        "yref": "paper",
                        "text": titles[cell - 1],
                        "showarrow": False,
                        "font": {"size": 16},
                        "xanchor": "center",
                        "yanchor": "bottom",
                    }
                )
    if annotations:
        layout["annotations"] = annotations
    return {"data": [], "layout": layout}


def add_trace(fig: Figure, trace_type: str, cell: int | None = None, **trace: Any) -> None:
    """Append a ``trace_type`` trace; with ``cell``, on that subplot's axes."""
    if cell is not None:
        suffix = str(cell) if cell > 1 else ""
        trace |= {"xaxis": "x" + suffix, "yaxis": "y" + suffix}
    fig["data"].append({"type": trace_type, **trace})


def update_axes(fig: Figure, letter: str, cell: int | None = None, **props: Any) -> None:
    """Set ``props`` on the ``letter`` ("x" or "y") axes: every one there is, or one cell's."""
    layout = fig["layout"]
    if cell is not None:
        names = [_axis(letter, cell)]
    else:
        names = [k for k in layout if k.startswith(f"{letter}axis")] or [_axis(letter, 1)]
    for name in names:
        layout.setdefault(name, {}).update(props)


def styled(
    title: str, height: int, fig: Figure | None = None, top: int = 72, **layout: object
) -> Figure:
    """Apply the house style to ``fig`` (a new figure when None): title, then legend, left."""
    fig = {"data": [], "layout": {}} if fig is None else fig
    fig["layout"].update(
        # no default template (saves ~10 KB per figure), spelled as plotly.py spells an emptied
        # one, so that plotly.py reading this JSON back does not apply its default theme either
        template={"data": {"scatter": [{"type": "scatter"}]}},
        title={
            "text": escape_html(title),
            "x": 0.01,
            "xanchor": "left",
            "yref": "container",
            "y": 1 - 12 / height,
            "yanchor": "top",
            "font": {"size": 15, "color": INK},
        },
        height=height,
        margin={"l": 64, "r": 24, "t": top, "b": 44},
        font={"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12},
        paper_bgcolor="white",
        plot_bgcolor="white",
        legend={
            "orientation": "h",
            "yref": "container",
            "y": 1 - 38 / height,
            "yanchor": "top",
            "x": 0,
            "xanchor": "left",
            "font": {"size": 12},
        },
        hoverlabel={"bgcolor": "white"},
        **layout,
    )
    update_axes(fig, "x", **AXIS_STYLE)
    update_axes(fig, "y", **AXIS_STYLE)
    return fig


def _sync_colorscale(zmax: int) -> list[list[object]]:
    """On a -0.5..zmax+0.5 scale: 0 syncs red, 1 green, 2 and more amber growing darker."""
    span = zmax + 1
    return [
        [0, MISSING],
        [1 / span, MISSING],
        [1 / span, OK],
        [2 / span, OK],
        [2 / span, EXTRA],
        [1, "#9a5b00"],
    ]


def placement_figure(grid: Grid) -> Figure:
    """Where grad syncs landed, per window and micro-batch, against where one belongs."""
    if grid.large:
        return _placement_heatmap(grid)
    fig = styled(
        "Where the gradient syncs landed (each dot a micro-batch)", 120 + 34 * len(grid.ranks)
    )
    groups: dict[str, tuple[list[float], list[int]]] = {
        k: ([], []) for k in ("idle", "ok", "extra", "missing", "open")
    }
    for rank, row in zip(grid.ranks, grid.rows, strict=True):
        for w, cell in enumerate(row):
            if cell is None or not cell.micro_batches:
                continue
            for m in range(cell.micro_batches):
                x = grid.first_window + w + (m + 0.5) / cell.micro_batches
                synced = m in cell.sync_micro_batches
                expected = m == cell.expected_micro_batch
                kind = (
                    ("ok" if expected else "extra" if cell.complete else "open")
                    if synced
                    else ("missing" if expected else "idle")
                )
                groups[kind][0].append(x)
                groups[kind][1].append(rank)
    styles = {
        "idle": ("micro-batch, no sync", {"color": MUTED, "size": 5}),
        "ok": ("sync where it belongs", {"color": OK, "size": 11}),
        "extra": ("extra sync", {"color": EXTRA, "size": 11}),
        "missing": (
            "missing sync",
            {"color": MISSING, "size": 12, "symbol": "circle-open", "line": {"width": 2.5}},
        ),
        # a window no optimizer step closed: where its syncs belong is not known
        "open": ("sync, window not closed by a step", {"color": ACCENT, "size": 9}),
    }
    for kind, (label, marker) in styles.items():
        xs, ys = groups[kind]
        if xs or kind not in ("idle", "open"):
            add_trace(
                fig,
                "scatter",
                x=typed(xs, "f4"),
                y=typed(ys, "i2"),
                mode="markers",
                name=label,
                marker=marker,
                hovertemplate="rank %{y}<br>window %{x:.2f}<extra>" + label + "</extra>",
                visible=True if xs else "legendonly",
            )
    update_axes(
        fig,
        "x",
        title={"text": "window"},
        dtick=1,
        range=[grid.first_window, grid.first_window + min(grid.windows, PLACEMENT_WINDOWS_SHOWN)],
        tick0=grid.first_window,
    )
    update_axes(fig, "y", title={"text": "rank"}, autorange="reversed", dtick=1)
    return fig


def _placement_heatmap(grid: Grid) -> Figure:
    depth = max((c.micro_batches for c in grid.cells(complete_only=False)), default=0)
    share = [[0.0] * grid.windows for _ in range(depth)]
    expected: list[tuple[int, int]] = []
    for w in range(grid.windows):
        column = grid.column(w)
        for cell in column:
            for m in cell.sync_micro_batches:
                share[m][w] += 1 / len(column)
        lasts = {c.expected_micro_batch for c in column if c.expected_micro_batch is not None}
        expected.extend((grid.first_window + w, m) for m in lasts)
    fig = styled("Share of ranks that synced, per window and micro-batch", 160 + 28 * depth)
    add_trace(
        fig,
        "heatmap",
        z=typed2d(share),
        x=typed(grid.window_numbers, "i4"),
        zmin=0,
        zmax=1,
        colorscale=[[0, "#f4f6f8"], [1, ACCENT]],
        colorbar={"title": {"text": "ranks"}, "tickformat": ".0%", "len": 0.9},
        hovertemplate="window %{x}, micro-batch %{y}: %{z:.1%} of ranks<extra></extra>",
    )
    add_trace(
        fig,
        "scatter",
        x=[w for w, _ in expected],
        y=[m for _, m in expected],
        mode="markers",
        name="where one sync belongs",
        hoverinfo="skip",
        marker={"symbol": "square-open", "size": 12, "color": OK, "line": {"width": 2}},
    )
    update_axes(fig, "x", title={"text": "window"})
    update_axes(fig, "y", title={"text": "micro-batch"}, autorange="reversed", dtick=1)
    return fig


def syncs_per_window_figure(grid: Grid, expected: float = 1.0) -> Figure:
    """Grad syncs per window: bars per rank, or a rank x window heatmap for large jobs."""
    if grid.large:
        return _syncs_heatmap(grid, expected)
    fig = styled("Gradient syncs per window, per rank", 300, barmode="group", bargap=0.25)
    for i, (rank, row) in enumerate(zip(grid.ranks, grid.rows, strict=True)):
        add_trace(
            fig,
            "bar",
            x=typed(range(grid.first_window, grid.first_window + len(row)), "i4"),
            y=typed([c.syncs if c else None for c in row]),
            name=f"rank {rank}",
            marker={"color": RANK_COLORS[i % len(RANK_COLORS)]},
            hovertemplate=f"rank {rank}" + ", window %{x}: %{y} syncs<extra></extra>",
        )
    # a horizontal line across the plot, labelled at its top right (plotly's add_hline)
    fig["layout"]["shapes"] = [
        {
            "type": "line",
            "xref": "x domain",
            "x0": 0,
            "x1": 1,
            "yref": "y",
            "y0": expected,
            "y1": expected,
            "line": {"color": OK, "dash": "dash", "width": 2},
        }
    ]
    fig["layout"]["annotations"] = [
        {
            "text": "expected",
            "showarrow": False,
            "xref": "x domain",
            "x": 1,
            "xanchor": "right",
            "yref": "y",
            "y": expected,
            "yanchor": "bottom",
        }
    ]
    update_axes(fig, "x", title={"text": "window"})
    update_axes(fig, "y", title={"text": "grad syncs"}, rangemode="tozero")
    return fig


def _syncs_heatmap(grid: Grid, expected: float) -> Figure:
    """Rank x window, binned to at most HEATMAP_ROWS rows; a bin shows its most deviant rank,
    so one rank that missed a sync among 1,024 stays visible."""
    size = -(-len(grid.ranks) // HEATMAP_ROWS)
    z: list[list[float | None]] = []
    labels: list[int] = []
    for start in range(0, len(grid.rows), size):
        rows = grid.rows[start : start + size]
        labels.append(grid.ranks[start])
        line: list[float | None] = []
        for w in range(grid.windows):
            values = [r[w].syncs for r in rows if w < len(r) and r[w] is not None]  # type: ignore[union-attr]
            line.append(max(values, key=lambda v: abs(v - expected)) if values else None)
        z.append(line)
    zmax = max(2, *(int(v) for row in z for v in row if v is not None))
    per = f" (each row {size} ranks; a row shows its most unusual rank)" if size > 1 else ""
    fig = styled("Gradient syncs per window, by rank (green: exactly one)" + per, 600)
    ranks = f"ranks %{{y}}+{size - 1}" if size > 1 else "rank %{y}"
    add_trace(
        fig,
        "heatmap",
        z=typed2d(z, smallest_dtype([v for row in z for v in row])),
        y=typed(labels, "i4"),
        x=typed(grid.window_numbers, "i4"),
        zmin=-0.5,
        zmax=zmax + 0.5,
        colorscale=_sync_colorscale(zmax),
        colorbar={"title": {"text": "syncs"}, "dtick": 1},
        hovertemplate=ranks + ", window %{x}: %{z} syncs<extra></extra>",
    )
    update_axes(fig, "x", title={"text": "window"})
    update_axes(fig, "y", title={"text": "rank"}, autorange="reversed")
    return fig


def _memory_series(grid: Grid) -> list[tuple[str, list[float | None]]]:
    """Peak memory per window in MiB: per rank, or max/min over ranks for many ranks."""
    per_mib = 2**20
    if grid.large or len(grid.ranks) > len(RANK_COLORS):
        columns = [  # 0: not measured, never drawn as 0 MiB
            [c.peak_memory_bytes / per_mib for c in grid.column(w) if c.peak_memory_bytes]
            for w in range(grid.windows)
        ]
        return [
            ("max over ranks", [max(col) if col else None for col in columns]),
            ("min over ranks", [min(col) if col else None for col in columns]),
        ]
    return [
        (
            f"rank {r}",
            [c.peak_memory_bytes / per_mib if c and c.peak_memory_bytes else None for c in row],
        )
        for r, row in zip(grid.ranks, grid.rows, strict=True)
    ]


def window_metrics_figure(grid: Grid) -> Figure:
    """Bytes, window time and peak memory per window (memory per rank, or max/min, named)."""
    fig = subplots(
        3,
        1,
        (
            "grad sync bytes",
            "window time (ms)",
            "peak memory"
            if any(c.peak_memory_bytes for c in grid.cells(complete_only=False))
            else "peak memory: not measured",
        ),
        shared_xaxes=True,
        vertical_spacing=0.07,
    )
    styled("Per window: bytes, time, memory", 580, fig, top=80, showlegend=True)
    x = typed(grid.window_numbers, "i4")
    synced = window_means(grid, "bytes")
    # the unit the tiles use for these bytes (33.0 KiB, not 0.03 MiB)
    unit, size = bytes_unit(max((v for v in synced if v is not None), default=0.0))
    add_trace(
        fig,
        "bar",
        1,
        x=x,
        y=typed([None if v is None else v / size for v in synced]),
        marker={"color": ACCENT},
        name=f"{unit} synced",
        showlegend=False,
        hovertemplate="window %{x}: %{y:.1f} " + unit + "<extra></extra>",
    )
    ms = [None if v is None else v / 1e6 for v in window_means(grid, "duration_ns")]
    add_trace(
        fig,
        "scatter",
        2,
        x=x,
        y=typed(ms),
        mode="lines+markers",
        line={"color": INK},
        name="ms",
        showlegend=False,
        hovertemplate="window %{x}: %{y:.2f} ms<extra></extra>",
    )
    for n, (label, ys) in enumerate(_memory_series(grid)):
        add_trace(
            fig,
            "scatter",
            3,
            x=x,
            y=typed(ys),
            mode="lines",
            name=label,
            line={"color": RANK_COLORS[n % len(RANK_COLORS)]},
            hovertemplate=label + ", window %{x}: %{y:.0f} MiB<extra></extra>",
        )
    update_axes(fig, "y", 1, title={"text": unit}, rangemode="tozero")
    update_axes(fig, "y", 2, title={"text": "ms"}, rangemode="tozero")
    # from 0, as the other two: a 0.25 MiB wobble on 306 MiB must not fill the panel
    update_axes(fig, "y", 3, title={"text": "MiB"}, rangemode="tozero")
    update_axes(fig, "x", 3, title={"text": "window"})
    if grid.windows <= 20:
        update_axes(fig, "x", dtick=1)
    return fig
