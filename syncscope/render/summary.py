"""Per-window aggregates and headline numbers that the HTML page and ``diff`` show.

One pass over the run model gives a rank x window grid of small cells; the charts, the headline
tiles and the before/after comparison all read that grid, so nothing is computed twice and no
renderer walks raw collectives at 1,024 ranks more than once.
"""

from __future__ import annotations

import re
import shlex
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from syncscope.model import Finding, Run, Verdict, Window, compress_ranks, figures, verdict_of
from syncscope.model.figures import Projection, mean
from syncscope.text import escape_html, human_bytes, human_ns

LARGE_JOB_RANKS = 16  # from this many ranks on, charts aggregate (heatmaps, no per-rank bars)


@dataclass(frozen=True)
class Cell:
    """What one rank did in one window, reduced to the numbers the report draws."""

    complete: bool
    micro_batches: int
    syncs: int  # grad sync rounds
    sync_micro_batches: tuple[int, ...]
    bytes: int  # grad sync bytes
    duration_ns: int
    step_ns: int
    peak_memory_bytes: int
    comm_ns: int | None
    exposed_comm_ns: int | None
    compute_ns: int | None

    @property
    def expected_micro_batch(self) -> int | None:
        """Where the one grad sync belongs: after the last backward of a complete window."""
        return self.micro_batches - 1 if self.complete and self.micro_batches else None

    @property
    def missing(self) -> bool:
        expected = self.expected_micro_batch
        return expected is not None and expected not in self.sync_micro_batches


def cell_of(window: Window) -> Cell:
    rounds: set[tuple[int, str, str]] = set()
    mbs: set[int] = set()
    nbytes = 0
    for c in window.collectives:
        if c.grad_sync:
            rounds.add((c.micro_batch, c.phase, c.issuer))
            mbs.add(c.micro_batch)
            nbytes += c.bytes
    return Cell(
        complete=window.complete,
        micro_batches=len(window.micro_batches),
        syncs=len(rounds),
        sync_micro_batches=tuple(sorted(mbs)),
        bytes=nbytes,
        duration_ns=window.duration_ns,
        step_ns=window.step_ns,
        peak_memory_bytes=window.peak_memory_bytes,
        comm_ns=window.comm_ns,
        exposed_comm_ns=window.exposed_comm_ns,
        compute_ns=window.compute_ns,
    )


@dataclass(frozen=True)
class Grid:
    """Rank x window cells; ``rows[i][w]`` is rank ``ranks[i]`` in window ``w`` (None: absent)."""

    ranks: tuple[int, ...]
    windows: int
    rows: tuple[tuple[Cell | None, ...], ...]
    # the index of the window in column 0: windows keep their run numbering on every chart
    # (traces number them from the first traced step, syncscope.window#N), as in the
    # terminal and report.json
    first_window: int = 0

    @property
    def window_numbers(self) -> range:
        """The windows' indices, column by column (the x axis of every per-window chart)."""
        return range(self.first_window, self.first_window + self.windows)

    @property
    def large(self) -> bool:
        return len(self.ranks) >= LARGE_JOB_RANKS

    @property
    def has_overlap(self) -> bool:
        return any(c is not None and c.comm_ns is not None for row in self.rows for c in row)

    def cells(self, *, complete_only: bool = True) -> list[Cell]:
        return [
            c
            for row in self.rows
            for c in row
            if c is not None and (c.complete or not complete_only)
        ]

    def column(self, w: int) -> list[Cell]:
        return [row[w] for row in self.rows if w < len(row) and row[w] is not None]  # type: ignore[misc]


def grid_of(run: Run) -> Grid:
    ranks = sorted(run.ranks, key=lambda r: r.rank)
    n = max((len(r.windows) for r in ranks), default=0)
    rows: list[tuple[Cell | None, ...]] = []
    for r in ranks:
        by_index: list[Cell | None] = [None] * n
        for i, window in enumerate(r.windows):
            by_index[i] = cell_of(window)
        rows.append(tuple(by_index))
    first = min((r.windows[0].index for r in ranks if r.windows), default=0)
    return Grid(ranks=tuple(r.rank for r in ranks), windows=n, rows=tuple(rows), first_window=first)


@dataclass(frozen=True)
class Headline:
    """The numbers at the top of the page and in ``diff``: what a person reads first.

    Window time, communication time, bytes and memory are the figures ``syncscope.model.figures``
    defines (median over ranks and steady windows; warm-up windows apart)."""

    verdict: Verdict
    world_size: int
    windows: int  # complete windows (most on any rank)
    micro_batches_per_window: int  # the most common count
    wrappers: tuple[str, ...]
    expected_syncs_per_window: float
    seen_syncs_per_window: float  # mean over complete windows and ranks
    seen_syncs_min: int
    seen_syncs_max: int
    rank_windows: int  # complete (rank, window) pairs
    rank_windows_off: int  # of which synced other than expected
    grad_sync_bytes_per_window: float  # median over ranks and steady windows
    window_ns: float  # median over ranks and steady windows (figures.window_time)
    peak_memory_bytes: int | None  # None: not measured
    wasted_bytes_per_window: float | None
    wasted_ns_per_window: float | None
    wasted_share: float | None
    baseline_window_ns: float | None  # the window time the projection starts from
    projected_window_ns: float | None
    exposed_comm_share: float | None  # exposed communication / window time, where traced
    steady_windows: int = 0
    warmup: tuple[tuple[int, str], ...] = ()  # windows shown apart, and why
    warmup_window_ns: float | None = None  # their median window time
    comm_ns: float | None = None  # median time with a collective in flight per window
    projection: Projection | None = None
    micro_batches_range: tuple[int, int] = (0, 0)  # fewest and most in a complete window

    @property
    def speedup(self) -> float | None:
        """Projected window-time ratio after the fix (2.0: twice as fast); None when the run
        cannot support a claim (``projection.omitted`` says why)."""
        p = self.projection
        if p is not None:
            return p.speedup.median if p.shown and p.speedup is not None else None
        if not self.projected_window_ns or not self.baseline_window_ns:
            return None
        return self.baseline_window_ns / self.projected_window_ns


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _largest(findings: Sequence[Finding], table: str, key: str) -> float | None:
    """Largest value of a cost/evidence key across findings: a floor, never double-counted."""
    values = [
        v
        for f in findings
        if (v := _number((f.cost if table == "cost" else f.evidence).get(key))) is not None
    ]
    return max(values) if values else None


def headline(run: Run, findings: Sequence[Finding], grid: Grid | None = None) -> Headline:
    grid = grid if grid is not None else grid_of(run)
    cells = grid.cells()
    syncs = [c.syncs for c in cells]
    counts = Counter(c.micro_batches for c in cells)
    steady = figures.steady_windows(run)
    window = figures.window_time(run, steady)
    warm = figures.warmup_time(run, steady)
    comm = figures.comm_time(run, steady)
    nbytes = figures.sync_bytes(run, steady)
    # The projected gain, from the steady windows of the ranks the findings that project it
    # cover (syncscope.model.figures.projection: a range, or the reason there is none).
    projecting = [f for f in findings if _number(f.cost.get("redundant_time_ns_per_window"))]
    projection = (
        figures.projection(run, {r for f in projecting for r in f.ranks} or None, steady)
        if projecting
        else None
    )
    shown = projection is not None and projection.shown
    expected = _largest(findings, "evidence", "expected_syncs_per_window")
    expected = expected if expected is not None else 1.0
    wrappers = sorted({w.kind for r in run.ranks for w in r.wrappers} or {"none"})
    return Headline(
        verdict=verdict_of(list(findings)),
        world_size=max(run.world_size, len(run.ranks)),
        windows=max((sum(1 for c in row if c and c.complete) for row in grid.rows), default=0),
        micro_batches_per_window=counts.most_common(1)[0][0] if counts else 0,
        wrappers=tuple(wrappers),
        expected_syncs_per_window=expected,
        seen_syncs_per_window=mean(syncs) if syncs else 0.0,
        seen_syncs_min=min(syncs, default=0),
        seen_syncs_max=max(syncs, default=0),
        rank_windows=len(syncs),
        rank_windows_off=sum(1 for n in syncs if n != expected),
        grad_sync_bytes_per_window=nbytes.median if nbytes else 0.0,
        window_ns=window.median if window else 0.0,
        peak_memory_bytes=figures.peak_memory(run),
        wasted_bytes_per_window=_largest(findings, "cost", "wasted_bytes_per_window"),
        wasted_ns_per_window=_largest(findings, "cost", "redundant_time_ns_per_window"),
        wasted_share=_largest(findings, "cost", "share_of_window_time"),
        baseline_window_ns=(
            projection.window.median if shown and projection and projection.window else None
        ),
        projected_window_ns=(
            projection.projected.median if shown and projection and projection.projected else None
        ),
        exposed_comm_share=figures.exposed_share(run, steady),  # the finding's share
        steady_windows=len(steady.windows),
        warmup=steady.warmup,
        warmup_window_ns=warm.median if warm else None,
        comm_ns=comm.median if comm else None,
        projection=projection,
        micro_batches_range=(min(counts), max(counts)) if counts else (0, 0),
    )


def window_basis(head: Headline) -> str:
    """How the window time was taken, and the windows shown apart."""
    if not head.windows:
        return "no window was closed by an optimizer step"
    if not head.steady_windows:
        return "the first window only: no steady window to measure"
    plural = "s" if head.steady_windows != 1 else ""
    text = f"median over ranks and {head.steady_windows} steady window{plural}"
    if head.warmup:
        apart = ", ".join(f"{i} ({why})" for i, why in head.warmup[:3])
        more = f" and {len(head.warmup) - 3} more" if len(head.warmup) > 3 else ""
        warm = f", {human_ns(head.warmup_window_ns)}" if head.warmup_window_ns else ""
        text += f"; apart: window {apart}{more}{warm}"
    return text


def window_time_text(head: Headline) -> str:
    """The headline window time, or "not measured" when no window closed."""
    return human_ns(head.window_ns) if head.windows else "not measured"


def window_means(grid: Grid, attr: str) -> list[float | None]:
    """Mean of a Cell attribute per window across ranks (None where no rank has a value)."""
    out: list[float | None] = []
    for w in range(grid.windows):
        values = [v for c in grid.column(w) if (v := getattr(c, attr)) is not None]
        out.append(mean(values) if values else None)
    return out


# Formatting shared by every renderer -------------------------------------------------------


def human_share(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.0f}%"


# Cost and evidence keys as people read them: key -> (label, unit). Units: "ns" (a duration),
# "bytes", "share" (0-1, shown as %), "x" (a ratio), "ms" (already milliseconds), "count".
LABELS: dict[str, tuple[str, str]] = {
    "wasted_bytes_per_window": ("redundant bytes per window", "bytes"),
    "redundant_collectives_per_window": ("redundant collectives per window", "count"),
    "redundant_time_ns_per_window": ("exposed sync time before the last micro-batch", "ns"),
    "reduced_twice_time_ns_per_window": ("time in the second reduction per window", "ns"),
    "share_of_window_time": ("share of window time", "share"),
    "window_ns": ("window time (median, steady windows)", "ns"),
    "projected_window_ns": ("projected window time after the fix", "ns"),
    "projection_omitted": ("window time not projected", "text"),
    "extra_memory_bytes_if_skipped": ("extra gradient memory if the sync is skipped", "bytes"),
    "extra_memory_bytes_if_gradient_sync_skipped": (
        "extra gradient memory with set_requires_gradient_sync instead",
        "bytes",
    ),
    "all_reduce_bytes_skipped_per_window": ("all-reduce bytes saved per window", "bytes"),
    "extra_memory_bytes_if_stage_1": ("extra gradient memory per rank with ZeRO-1", "bytes"),
    "gradient_accumulation_steps": ("DeepSpeed gradient_accumulation_steps", "count"),
    "micro_batches_per_engine_step": ("micro-batches per engine.step()", "count"),
    "zero_stage": ("ZeRO stage", "count"),
    "micro_batch": ("micro-batch", "count"),
    "deepspeed_grad_sync_collectives": ("DeepSpeed grad-sync collectives", "count"),
    "manual_grad_sync_collectives": ("hand-written grad-sync collectives", "count"),
    "estimated_extra_memory_bytes": ("estimated extra gradient memory", "bytes"),
    "peak_memory_bytes": ("peak memory", "bytes"),
    "mean_collective_ns": ("mean collective time", "ns"),
    "estimated_latency_overhead_ns_per_window": ("estimated call overhead per window", "ns"),
    "collective_call_ns": ("time per collective call (median)", "ns"),
    "extra_collectives_per_window": ("extra collectives per window", "count"),
    "ideal_collectives_per_round": ("collectives a bucketed round needs", "count"),
    "collectives_per_round": ("collectives per round", "count"),
    "lost_share_of_gradient": ("share of the gradient lost", "share"),
    "effective_batch_share": ("effective batch, share of the usual", "share"),
    "windows_affected": ("windows affected", "count"),
    "exposed_ns_per_window": ("exposed communication per window", "ns"),
    "exposed_share": ("exposed share of window time", "share"),
    "worst_share": ("worst exposed share", "share"),
    "mean_exposed_ms": ("mean exposed communication", "ms"),
    "mean_comm_ms": ("mean communication time", "ms"),
    "comm_ns_per_window": ("communication per window", "ns"),
    "mean_bytes": ("mean bytes per collective", "bytes"),
    "micro_batches": ("micro-batches per window", "count"),
    "expected_grad_syncs": ("expected grad syncs per window", "count"),
    "expected_micro_batches": ("expected at micro-batch", "count"),
    "grad_syncs": ("grad syncs per window", "count"),
    "grad_sync_micro_batches": ("grad syncs at micro-batch", "count"),
    "grad_sync_collectives": ("grad-sync collectives per window", "count"),
    "unsynced_micro_batches": ("micro-batches never synced", "count"),
    "example_rank": ("example rank", "count"),
    "example_window": ("example window", "count"),
}


def label_of(key: str) -> str:
    """A human label for a cost or evidence key; keys not in LABELS lose their unit suffix."""
    if key in LABELS:
        return LABELS[key][0]
    words = [w for w in key.split("_") if w]
    timed = "ns" in words
    words = [w for w in words if w not in ("ns", "bytes")]
    if timed and "time" not in words:
        words.insert(words.index("per") if "per" in words else len(words), "time")
    return " ".join(words) or key


def unit_of(key: str) -> str:
    if key in LABELS:
        return LABELS[key][1]
    k = key.lower()
    if "bytes" in k:
        return "bytes"
    if k.endswith("_ns") or "_ns_" in k or k.startswith("ns_"):
        return "ns"
    if k.endswith("_ms"):
        return "ms"
    if "share" in k or "fraction" in k or "ratio_of" in k:
        return "share"
    if "speedup" in k or "speed_up" in k:
        return "x"
    return "count"


MAX_LIST_ITEMS = 24  # items of a list value shown, then how many more


def human_value(key: str, value: object) -> str:
    """Format a cost or evidence value by its unit (LABELS, else what its key says): ranks,
    windows and micro-batches as ranges (``0-2``), other lists item by item, a mapping as
    ``label value`` pairs; never Python's own rendering of a list or a dict."""
    if value is None:
        return "unknown"
    if isinstance(value, dict):
        return "; ".join(f"{label_of(str(k))} {human_value(str(k), v)}" for k, v in value.items())
    if isinstance(value, list | tuple | set | frozenset):
        items = list(value)
        ints = [v for v in items if isinstance(v, int) and not isinstance(v, bool)]
        if items and len(ints) == len(items) and any(w in key for w in ("rank", "window", "micro")):
            return compress_ranks(ints)
        more = f" … ({len(items) - MAX_LIST_ITEMS} more)" if len(items) > MAX_LIST_ITEMS else ""
        return ", ".join(human_value(key, v) for v in items[:MAX_LIST_ITEMS]) + more
    number = _number(value)
    if number is None:
        return str(value)
    unit = unit_of(key)
    if unit == "bytes":
        return human_bytes(number)
    if unit == "ns":
        return human_ns(number)
    if unit == "ms":
        return human_ns(number * 1e6)
    if unit == "share":
        return human_share(number)
    if unit == "x":
        return f"{number:.2f}x"
    return f"{number:g}" if isinstance(value, float) else f"{int(number):,}"


def _us_figure(row: dict[str, object], name: str) -> str:
    time, share = row.get(f"{name}_time(us)"), row.get(f"{name}_time_pctg")
    if not isinstance(time, int | float):
        return ""
    pct = f" ({share:.1f}%)" if isinstance(share, int | float) else ""
    return f"{name.replace('_', '-')} {human_ns(time * 1e3)}{pct}"


def hta_lines(hta: object) -> list[str]:
    """``analyze --hta``'s figures (HTA's overlap and temporal breakdown) as sentences, one
    per line: the same words in the terminal and the page (report.json keeps the data)."""
    if not isinstance(hta, dict):
        return [str(hta)]
    lines: list[str] = []
    if "error" in hta:
        lines.append(f"not applied: {hta['error']}")
    overlap = hta.get("comm_comp_overlap_pct")
    if isinstance(overlap, dict) and overlap:
        shares = ", ".join(f"rank {r} {v:.1f}%" for r, v in overlap.items())
        lines.append(f"communication overlapped with compute: {shares}")
    breakdown = hta.get("temporal_breakdown")
    for row in breakdown if isinstance(breakdown, list) else []:
        if not isinstance(row, dict):
            continue
        rank = row.get("rank")
        parts = [_us_figure(row, name) for name in ("idle", "compute", "non_compute")]
        kernels = row.get("kernel_time(us)")
        if isinstance(kernels, int | float):
            parts.append(f"GPU kernel time {human_ns(kernels * 1e3)}")
        label = f"rank {int(rank)}" if isinstance(rank, int | float) else "rank ?"
        lines.append(f"{label}: " + ", ".join(p for p in parts if p))
    return lines


def plain_text(text: str) -> str:
    """A fix summary without its markdown marks (``*and*`` -> ``and``), for the terminal."""
    return re.sub(r"(\*\*|\*|`)(?=\S)(.+?)(?<=\S)\1", r"\2", text)


def html_text(text: str) -> str:
    """A fix summary as HTML: escaped, with ``*x*``/``**x**`` as emphasis and ``x`` as code."""
    out = escape_html(text)
    out = re.sub(r"\*\*(?=\S)(.+?)(?<=\S)\*\*", r"<strong>\1</strong>", out)
    out = re.sub(r"\*(?=\S)(.+?)(?<=\S)\*", r"<em>\1</em>", out)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", out)


def title_of(run: Run) -> str:
    """What the run was: its command, or for traces what they are."""
    if run.meta.command:
        return shlex.join(run.meta.command)
    if run.meta.source == "trace":
        ranks = len(run.ranks)
        return f"torch.profiler traces of {ranks} rank{'s' if ranks != 1 else ''}"
    return ""


def frameworks_of(run: Run) -> str:
    """The training frameworks the ranks ran under, with their versions, as report.json's
    ``ranks[].framework`` records them: ``transformers 4.57.1``, ``deepspeed 0.19.8 (ZeRO
    2)``; "" when none (a plain torch loop)."""
    seen: list[str] = []
    for r in run.ranks:
        if not r.framework:
            continue
        text = f"{r.framework} {r.framework_version}".strip()
        if r.zero_stage is not None:
            text += f" (ZeRO {r.zero_stage})"
        if text not in seen:
            seen.append(text)
    return ", ".join(seen)
