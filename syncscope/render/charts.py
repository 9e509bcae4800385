"""Plotly figures built from the run model. Analysis code never plots; these functions do.

Every builder takes model objects (or the ``summary.Grid`` built from them) and returns a
``plotly.graph_objects.Figure``. Arrays go in as typed-array specs (``{"dtype", "bdata"}``),
which keeps a 1,024-rank page small. Strings that come from a run (module and op names) are
HTML-escaped before they reach plotly, which renders a subset of HTML in labels.
"""

from __future__ import annotations

import array
import base64
import html
import sys
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from syncscope.render.summary import Grid, window_means

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


def styled(
    title: str, height: int, fig: go.Figure | None = None, top: int = 72, **layout: object
) -> go.Figure:
    """Apply the house style to ``fig`` (a new figure when None): title, then legend, left."""
    fig = go.Figure() if fig is None else fig
    fig.update_layout(
        template=go.layout.Template(),  # no default template: saves ~10 KB per figure
        title={
            "text": html.escape(title),
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
    fig.update_xaxes(gridcolor="#eef0f3", zeroline=False, linecolor="#d5d9df")
    fig.update_yaxes(gridcolor="#eef0f3", zeroline=False, linecolor="#d5d9df")
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


def placement_figure(grid: Grid) -> go.Figure:
    """Where grad syncs landed, per window and micro-batch, against where one belongs."""
    if grid.large:
        return _placement_heatmap(grid)
    fig = styled(
        "Where the gradient syncs landed (each dot a micro-batch)", 120 + 34 * len(grid.ranks)
    )
    groups: dict[str, tuple[list[float], list[int]]] = {
        k: ([], []) for k in ("idle", "ok", "extra", "missing")
    }
    for rank, row in zip(grid.ranks, grid.rows, strict=True):
        for w, cell in enumerate(row):
            if cell is None or not cell.micro_batches:
                continue
            for m in range(cell.micro_batches):
                x = w + (m + 0.5) / cell.micro_batches
                synced = m in cell.sync_micro_batches
                expected = m == cell.expected_micro_batch
                kind = (
                    ("ok" if expected else "extra")
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
    }
    for kind, (label, marker) in styles.items():
        xs, ys = groups[kind]
        if xs or kind != "idle":
            fig.add_trace(
                go.Scatter(
                    x=typed(xs, "f4"),
                    y=typed(ys, "i2"),
                    mode="markers",
                    name=label,
                    marker=marker,
                    hovertemplate="rank %{y}<br>window %{x:.2f}<extra>" + label + "</extra>",
                    visible=True if xs else "legendonly",
                )
            )
    fig.update_xaxes(
        title="window", dtick=1, range=[0, min(grid.windows, PLACEMENT_WINDOWS_SHOWN)], tick0=0
    )
    fig.update_yaxes(title="rank", autorange="reversed", dtick=1)
    return fig


def _placement_heatmap(grid: Grid) -> go.Figure:
    depth = max((c.micro_batches for c in grid.cells(complete_only=False)), default=0)
    share = [[0.0] * grid.windows for _ in range(depth)]
    expected: list[tuple[int, int]] = []
    for w in range(grid.windows):
        column = grid.column(w)
        for cell in column:
            for m in cell.sync_micro_batches:
                share[m][w] += 1 / len(column)
        lasts = {c.expected_micro_batch for c in column if c.expected_micro_batch is not None}
        expected.extend((w, m) for m in lasts)
    fig = styled("Share of ranks that synced, per window and micro-batch", 160 + 28 * depth)
    fig.add_trace(
        go.Heatmap(
            z=typed2d(share),
            zmin=0,
            zmax=1,
            colorscale=[[0, "#f4f6f8"], [1, ACCENT]],
            colorbar={"title": "ranks", "tickformat": ".0%", "len": 0.9},
            hovertemplate="window %{x}, micro-batch %{y}: %{z:.1%} of ranks<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[w for w, _ in expected],
            y=[m for _, m in expected],
            mode="markers",
            name="where one sync belongs",
            hoverinfo="skip",
            marker={"symbol": "square-open", "size": 12, "color": OK, "line": {"width": 2}},
        )
    )
    fig.update_xaxes(title="window")
    fig.update_yaxes(title="micro-batch", autorange="reversed", dtick=1)
    return fig


def syncs_per_window_figure(grid: Grid, expected: float = 1.0) -> go.Figure:
    """Grad syncs per window: bars per rank, or a rank x window heatmap for large jobs."""
    if grid.large:
        return _syncs_heatmap(grid, expected)
    fig = styled("Gradient syncs per window, per rank", 300, barmode="group", bargap=0.25)
    for i, (rank, row) in enumerate(zip(grid.ranks, grid.rows, strict=True)):
        fig.add_trace(
            go.Bar(
                x=typed(range(len(row)), "i4"),
                y=typed([c.syncs if c else None for c in row]),
                name=f"rank {rank}",
                marker_color=RANK_COLORS[i % len(RANK_COLORS)],
                hovertemplate=f"rank {rank}" + ", window %{x}: %{y} syncs<extra></extra>",
            )
        )
    fig.add_hline(
        y=expected,
        line={"color": OK, "dash": "dash", "width": 2},
        annotation_text="expected",
        annotation_position="top right",
    )
    fig.update_xaxes(title="window")
    fig.update_yaxes(title="grad syncs", rangemode="tozero")
    return fig


def _syncs_heatmap(grid: Grid, expected: float) -> go.Figure:
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
    fig.add_trace(
        go.Heatmap(
            z=typed2d(z, smallest_dtype([v for row in z for v in row])),
            y=typed(labels, "i4"),
            zmin=-0.5,
            zmax=zmax + 0.5,
            colorscale=_sync_colorscale(zmax),
            colorbar={"title": "syncs", "dtick": 1},
            hovertemplate=f"ranks %{{y}}+{size - 1}" if size > 1 else "rank %{y}",
        )
    )
    fig.data[0].hovertemplate += ", window %{x}: %{z} syncs<extra></extra>"
    fig.update_xaxes(title="window")
    fig.update_yaxes(title="rank", autorange="reversed")
    return fig


def window_metrics_figure(grid: Grid) -> go.Figure:
    """Bytes synced, window time and peak memory per window (mean, or per rank when few)."""
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.07,
        subplot_titles=("grad sync bytes", "window time (ms)", "peak memory"),
    )
    styled("Per window: bytes, time, memory", 580, fig, top=80, showlegend=False)
    x = typed(range(grid.windows), "i4")
    mib = [None if v is None else v / 2**20 for v in window_means(grid, "bytes")]
    fig.add_trace(
        go.Bar(
            x=x,
            y=typed(mib),
            marker_color=ACCENT,
            name="MiB synced",
            hovertemplate="window %{x}: %{y:.1f} MiB<extra></extra>",
        ),
        row=1,
        col=1,
    )
    ms = [None if v is None else v / 1e6 for v in window_means(grid, "duration_ns")]
    fig.add_trace(
        go.Scatter(
            x=x,
            y=typed(ms),
            mode="lines+markers",
            line_color=INK,
            name="ms",
            hovertemplate="window %{x}: %{y:.2f} ms<extra></extra>",
        ),
        row=2,
        col=1,
    )
    per_mib = 2**20
    series: list[tuple[str, list[float | None]]]
    if grid.large or len(grid.ranks) > len(RANK_COLORS):
        columns = [
            [c.peak_memory_bytes / per_mib for c in grid.column(w)] for w in range(grid.windows)
        ]
        series = [
            ("max over ranks", [max(col) if col else None for col in columns]),
            ("min over ranks", [min(col) if col else None for col in columns]),
        ]
    else:
        series = [
            (f"rank {r}", [c.peak_memory_bytes / per_mib if c else None for c in row])
            for r, row in zip(grid.ranks, grid.rows, strict=True)
        ]
    for n, (label, ys) in enumerate(series):
        fig.add_trace(
            go.Scatter(
                x=x,
                y=typed(ys),
                mode="lines",
                name=label,
                line_color=RANK_COLORS[n % len(RANK_COLORS)],
                hovertemplate=label + ", window %{x}: %{y:.0f} MiB<extra></extra>",
            ),
            row=3,
            col=1,
        )
    fig.update_yaxes(title_text="MiB", row=1, col=1, rangemode="tozero")
    fig.update_yaxes(title_text="ms", row=2, col=1, rangemode="tozero")
    fig.update_yaxes(title_text="MiB", row=3, col=1)
    fig.update_xaxes(title_text="window", row=3, col=1)
    fig.update_xaxes(dtick=1 if grid.windows <= 20 else None)
    return fig
