"""The headline figures, defined once: every renderer, ``diff``, report.json and the test API
read them from here (docs/concepts.md, "Figures", says the same in prose).

* **Steady windows.** Complete windows (ended by an optimizer step, with at least one
  micro-batch), minus the *warm-up* windows, which are shown apart and never averaged in:
  the first complete window of the program, window 0 (lazy initialisation, DDP's bucket rebuild,
  ``torch.compile``'s first compilation, allocator growth all land there; a capture that
  starts later, ``--skip-windows N``, has none), and any later window
  whose duration (median across ranks) is more than ``OUTLIER_FACTOR`` times the median of the
  other non-first windows (a recompilation, a checkpoint, a stall). Windows are matched across
  ranks by index.
* **Window time.** Median over ranks and steady windows of ``Window.duration_ns`` (from the
  window's first micro-batch to the end of its optimizer step). With no steady window (a
  1-window run) it is the first window's, and says so.
* **Communication time.** Per rank and window, the time with at least one collective in flight:
  the *union* of the intervals from each collective's issue to its completion (or to the
  return of its call when completion was not seen), clipped to the window. Never a sum of
  overlapping intervals, so it never exceeds the window time. Traces measure the same union
  from device kernels (``Window.comm_ns``) and that is used where present.
* **Exposed communication** (traces): per window, the communication time (above) not
  overlapped with compute, so never more than it; over the same steady windows, shown as the
  median with the median communication and window time beside it, and the share is
  exposed / window time of those medians.
* **Exposed sync time** of a micro-batch: the union of the time the training thread spent
  inside its gradient collectives' calls, the wait from the last one issued during the
  backward to the end of the backward (DDP and FSDP issue asynchronously from autograd hooks
  and wait at its end), and, for collectives issued after the backward (a hand-written loop),
  each one's issue to completion. This is what skipping the sync can save; compute that ran
  meanwhile is not counted.
* **Grad-sync bytes.** Per rank and window, the sum of the input sizes of its
  gradient-reducing collectives; the figure is the median over ranks and steady windows.
* **Peak memory.** The highest per-window peak on any rank; ``None`` (shown "not measured")
  when no window carried a measurement, never 0.
* **Projection.** For each (rank, steady window): window time minus the exposed sync time of
  its micro-batches before the last, each the least over the ranks (``saved_ns``: skew between
  ranks is moved to the last sync, not saved); the speed-up is window / projected. Shown as the median
  with its range across steady windows, and omitted, with the reason, when there are fewer
  than ``MIN_STEADY`` steady windows or when the steady windows' time varies (interquartile
  range) by more than the predicted saving. Where the ranks compute on CPU (gloo's
  collectives then run on the cores the ranks compute on), removing a sync also removes the
  contention it caused with compute that overlapped it: the range is widened up to the
  syncs' whole time in flight (``in_flight_sync_ns``, per micro-batch the least over the
  ranks), with that reason (``Projection.widened``); the median stays the exposed-wait figure.
  Under FSDP on CPU the range is said to be a floor: removing a reduce-scatter there also sped
  up the all-gathers that stay (docs/benchmarks/prediction-examples.md), which no figure of
  the buggy run measures. So is it on CPU where the steady windows' median is under
  ``SHORT_WINDOW_NS``: there each sync's fixed cost of a call weighs as much as its wait, and
  the measured gain came out above the range. Where the window time of the run varies, the
  low end is lowered by its own noise (times the steady windows' q25/q75, when that moves it
  by 0.5% or more, never below 1.00x), with that reason: a measurement after the fix has the
  same noise, and one below 1.00x is that noise (``fix --verify`` shows its range).
* **Measured speed-up** (``fix --verify``, benchmarks): the original's window time over the
  fixed run's (medians), with its noise range from each run's steady windows (q25 over q75,
  q75 over q25); ``judge`` says whether it lies inside the projected range (above a floor
  counts), overlaps it within that noise, or misses it below or above.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from syncscope.model import Run, Window

OUTLIER_FACTOR = 3.0
MIN_STEADY = 2


def mean(values: Iterable[float]) -> float:
    """``statistics.fmean`` of ``values``, 0.0 for none (without importing ``statistics``:
    it brings ``decimal`` and ``fractions``, to analyze a trace that may be 9 MiB)."""
    items = list(values)
    return math.fsum(items) / len(items) if items else 0.0


def median(values: Iterable[float]) -> float:
    """``statistics.median`` of a non-empty iterable (the mean of the middle two when even),
    as a float."""
    items = sorted(values)
    mid = len(items) // 2
    return float(items[mid]) if len(items) % 2 else (items[mid - 1] + items[mid]) / 2


def _quantile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    items = sorted(values)
    pos = (len(items) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(items) - 1)
    return items[lo] + (items[hi] - items[lo]) * (pos - lo)


@dataclass(frozen=True)
class Steady:
    """Which complete windows count (``windows``) and which are shown apart (``warmup``)."""

    windows: tuple[int, ...]
    warmup: tuple[tuple[int, str], ...]  # (window index, why it is apart)

    def __contains__(self, index: object) -> bool:
        return index in self.windows


def _complete(window: Window) -> bool:
    return window.complete and len(window.micro_batches) > 0


def steady_windows(run: Run) -> Steady:
    by_index: dict[int, list[int]] = {}
    for rank in run.ranks:
        for w in rank.windows:
            if _complete(w):
                by_index.setdefault(w.index, []).append(w.duration_ns)
    indices = sorted(by_index)
    if len(indices) < 2:
        return Steady((), tuple((i, "the only complete window") for i in indices))
    warmup: list[tuple[int, str]] = []
    rest = indices
    if indices[0] == 0:  # the program's first step; after --skip-windows, windows start later
        warmup, rest = [(0, "first window, warm-up")], indices[1:]
    durations = {i: median(by_index[i]) for i in rest}
    steady: list[int] = []
    for i in rest:
        others = [d for j, d in durations.items() if j != i]
        typical = median(others) if others else durations[i]
        if others and typical > 0 and durations[i] > OUTLIER_FACTOR * typical:
            warmup.append((i, f"{durations[i] / typical:.1f}x the median of the other windows"))
        else:
            steady.append(i)
    return Steady(tuple(steady), tuple(warmup))


@dataclass(frozen=True)
class Stat:
    """A figure measured over ``n`` (rank, window) pairs: median, with its range."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat | None:
        return cls(median(values), min(values), max(values), len(values)) if values else None


def _windows(run: Run, steady: Steady, ranks: Iterable[int] | None = None) -> list[Window]:
    """The steady windows of every rank (or of ``ranks``); the warm-up ones if none is steady."""
    wanted = None if ranks is None else set(ranks)
    chosen = steady.windows or tuple(i for i, _ in steady.warmup)
    return [
        w
        for r in run.ranks
        if wanted is None or r.rank in wanted
        for w in r.windows
        if _complete(w) and w.index in chosen
    ]


def within_noise(before: Stat, after: Stat) -> bool:
    """Whether two runs' figures differ by less than their own spread: either median lies
    inside the other run's range over its windows (``diff`` and ``fix --verify``)."""
    return before.low <= after.median <= before.high or after.low <= before.median <= after.high


def window_durations(run: Run, steady: Steady | None = None) -> list[float]:
    """The durations ``window_time`` is figured over (steady windows of every rank)."""
    steady = steady if steady is not None else steady_windows(run)
    return [float(w.duration_ns) for w in _windows(run, steady)]


def window_time(run: Run, steady: Steady | None = None) -> Stat | None:
    steady = steady if steady is not None else steady_windows(run)
    return Stat.of([w.duration_ns for w in _windows(run, steady)])


def warmup_time(run: Run, steady: Steady | None = None) -> Stat | None:
    """Window time of the windows shown apart (only when there are steady ones)."""
    steady = steady if steady is not None else steady_windows(run)
    if not steady.windows:
        return None
    apart = {i for i, _ in steady.warmup}
    return Stat.of(
        [w.duration_ns for r in run.ranks for w in r.windows if _complete(w) and w.index in apart]
    )


def union_ns(intervals: Iterable[tuple[int, int]], lo: int, hi: int) -> int:
    """Length of the union of ``intervals`` clipped to ``[lo, hi]``."""
    total, reach = 0, lo
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in intervals):
        if b <= reach:
            continue
        total += b - max(a, reach)
        reach = b
    return total


def comm_ns(window: Window) -> int:
    """Time with at least one collective in flight (trace: kernel union) in the window."""
    if window.comm_ns is not None:
        return min(window.comm_ns, window.duration_ns)
    spans = (
        (c.start_ns, c.done_ns if c.done_ns is not None else c.end_ns) for c in window.collectives
    )
    return union_ns(spans, window.start_ns, window.end_ns)


def comm_time(run: Run, steady: Steady | None = None) -> Stat | None:
    steady = steady if steady is not None else steady_windows(run)
    return Stat.of([comm_ns(w) for w in _windows(run, steady)])


def exposed_ns(window: Window) -> int | None:
    """Collective time not overlapped with compute (traces), never more than ``comm_ns``:
    both come from the same kernels, clipped to the same window."""
    if window.exposed_comm_ns is None:
        return None
    return min(window.exposed_comm_ns, comm_ns(window))


def traced_windows(run: Run, steady: Steady | None = None) -> list[tuple[int, Window]]:
    """(rank, window) of the steady windows (the warm-up ones if none is steady) whose
    overlap was measured: what exposed communication is figured over, everywhere."""
    steady = steady if steady is not None else steady_windows(run)
    chosen = steady.windows or tuple(i for i, _ in steady.warmup)
    return [
        (r.rank, w)
        for r in run.ranks
        for w in r.windows
        if _complete(w) and w.index in chosen and w.exposed_comm_ns is not None and w.comm_ns
    ]


def exposed_share(run: Run, steady: Steady | None = None) -> float | None:
    """Median exposed communication / median window time over ``traced_windows``; None
    without a measured window (the exposed-communication finding's share, and the tile's)."""
    rows = traced_windows(run, steady)
    if not rows:
        return None
    window = median(w.duration_ns for _, w in rows)
    return median(exposed_ns(w) or 0 for _, w in rows) / window if window else 0.0


def sync_bytes(run: Run, steady: Steady | None = None) -> Stat | None:
    steady = steady if steady is not None else steady_windows(run)
    return Stat.of([w.grad_sync_bytes for w in _windows(run, steady)])


def peak_memory(run: Run) -> int | None:
    """Highest per-window peak on any rank; None when nothing was measured."""
    peak = max((w.peak_memory_bytes for r in run.ranks for w in r.windows), default=0)
    return peak if peak > 0 else None


def _sync_spans(window: Window, micro_batch: int, in_flight: bool) -> list[tuple[int, int]]:
    """The intervals ``exposed_sync_ns`` (and, ``in_flight``, ``in_flight_sync_ns``) join."""
    syncs = [c for c in window.collectives if c.grad_sync and c.micro_batch == micro_batch]
    if not syncs:
        return []
    spans = [(c.start_ns, c.end_ns) for c in syncs]
    end = (
        window.micro_batches[micro_batch].end_ns
        if 0 <= micro_batch < len(window.micro_batches)
        else window.start_ns
    )
    during = [c for c in syncs if c.start_ns < end]
    if during:  # issued by the backward's hooks, waited on at its end (DDP, FSDP)
        spans.append((max(c.start_ns for c in during), end))
    for c in syncs:  # issued after the backward (a user's loop): the thread waits for each
        if c.start_ns >= end or in_flight:
            spans.append((c.start_ns, c.done_ns if c.done_ns is not None else c.end_ns))
    return spans


def exposed_sync_ns(window: Window, micro_batch: int) -> int:
    """Time the training thread spent in, or waiting for, one micro-batch's gradient syncs."""
    spans = _sync_spans(window, micro_batch, in_flight=False)
    return union_ns(spans, window.start_ns, window.end_ns) if spans else 0


def in_flight_sync_ns(window: Window, micro_batch: int) -> int:
    """The exposed sync time of one micro-batch joined with the time its gradient syncs were
    in flight (issue to completion): all a sync can cost where its work shares the cores of
    the compute it overlaps (gloo on CPU)."""
    spans = _sync_spans(window, micro_batch, in_flight=True)
    return union_ns(spans, window.start_ns, window.end_ns) if spans else 0


def early_sync_ns(window: Window) -> int:
    """Exposed sync time of every micro-batch but the last: what a once-per-window sync saves."""
    last = len(window.micro_batches) - 1
    early = {c.micro_batch for c in window.collectives if c.grad_sync and c.micro_batch < last}
    return sum(exposed_sync_ns(window, m) for m in early)


def saved_ns(run: Run, in_flight: bool = False) -> dict[int, int]:
    """Per window index: what a once-per-window sync saves, the same on every rank.

    For each micro-batch but the last, the *smallest* exposed sync time over the ranks: a rank
    that waited longer was waiting for a slower rank, and that skew is not saved by syncing
    less, only moved to the last micro-batch's sync (the slowest rank waits least, so its
    exposed time is the communication itself). ``in_flight``: the syncs' whole time in flight
    instead (``in_flight_sync_ns``), the most removing them can save where they contend with
    compute for the same cores."""
    measure = in_flight_sync_ns if in_flight else exposed_sync_ns
    by_index: dict[int, list[Window]] = {}
    for r in run.ranks:
        for w in r.windows:
            if _complete(w):
                by_index.setdefault(w.index, []).append(w)
    out: dict[int, int] = {}
    for index, windows in by_index.items():
        n = min(len(w.micro_batches) for w in windows)
        early = {c.micro_batch for w in windows for c in w.collectives if c.grad_sync}
        out[index] = sum(min(measure(w, m) for w in windows) for m in sorted(early) if m < n - 1)
    return out


BASIS = (
    "window time minus the measured time spent in, or waiting for, the gradient syncs of every "
    "micro-batch but the last (per micro-batch, the least any rank waited: skew between ranks "
    "is not saved)"
)
CPU_CONTENTION = (
    "range widened: the ranks compute on CPU, where their collectives run on the same cores as the compute "
    "they overlap, so removing a sync also removes that contention: the range reaches up to "
    "the syncs' whole time in flight"
)
SHORT_WINDOW_NS = 20_000_000  # on CPU, windows shorter than this: the range is a floor
SHORT_WINDOWS = (
    "at windows of {ms:.1f} ms on CPU, each sync's fixed cost of a call (gloo's and the "
    "capture's, per collective), which no figure of this run measures, weighs as much as its "
    "wait: read the range as a floor"
)
FSDP_ON_CPU = (
    "under FSDP on CPU, removing a reduce-scatter also speeds up the all-gathers that stay, "
    "which no figure of this run measures: read the range as a floor"
)
NOISE = (
    "low end lowered {pct:.1f}% for the window time's own noise in this run (q25/q75 of its "
    "steady windows, not below 1.00x), which a measurement after the fix shares"
)
MIN_NOISE = 0.005  # the low end is lowered for noise only when it moves it by this share


@dataclass(frozen=True)
class Projection:
    """Projected window time after a once-per-window sync, sized to the evidence."""

    window: Stat | None  # measured, over the windows used
    projected: Stat | None
    speedup: Stat | None  # range of per (rank, window) ratios; median: window / projected medians
    steady_windows: int
    basis: str
    omitted: str = ""  # why no gain is claimed ("" when it is)
    widened: str = ""  # why the range reaches past the exposed-wait figure, or is a floor
    floor: bool = False  # the range is read as a floor: a measurement above it is no miss

    @property
    def shown(self) -> bool:
        return not self.omitted and self.speedup is not None

    def text(self) -> str:
        """``1.6-2.1x (median 1.8x) over 6 steady rank-windows``, the reason a range is
        widened beside it, or the reason it is not projected."""
        if not self.shown or self.speedup is None:
            return f"not projected: {self.omitted}"
        s = self.speedup
        span = f"{s.low:.2f}-{s.high:.2f}x" if s.high - s.low >= 0.005 else f"{s.median:.2f}x"
        text = f"{span} (median {s.median:.2f}x) over {s.n} steady rank-windows"
        return f"{text} ({self.widened})" if self.widened else text


def _speedup(
    durations: list[float],
    projected: list[float],
    ratios: list[float],
    top: float = 0.0,
    noise: float = 1.0,
) -> Stat | None:
    """The range of the per-(rank, window) ratios (up to ``top`` where it is widened, its
    low end times ``noise`` where the window time's own noise lowers it), and as its middle
    figure the ratio of the two medians shown beside it (window -> projected window), so that
    the figures a reader sees divide to the speed-up claimed (a median of ratios does not:
    13.9/9.2 ms vs 1.55x)."""
    if not ratios:
        return None
    low, high = min(ratios), max(ratios)
    at_medians = median(durations) / median(projected)
    return Stat(min(max(at_medians, low), high), low * noise, max(high, top), len(ratios))


def _noise(durations: list[float], ratios: list[float]) -> float:
    """q25/q75 of the windows' durations: how far the window time's own noise can move a
    ratio of two runs' medians down (each run off by a quartile, opposite ways), but never
    below 1.00x (removing a sync does not slow a step: a slower measurement is its noise,
    which ``fix --verify`` shows beside it); 1.0 when that moves the low end by under
    ``MIN_NOISE``."""
    if len(durations) < 2 or not ratios:
        return 1.0
    q75 = _quantile(durations, 0.75)
    factor = _quantile(durations, 0.25) / q75 if q75 > 0 else 1.0
    factor = max(factor, min(1.0, 1.0 / min(ratios)))
    return factor if 1.0 - factor >= MIN_NOISE else 1.0


def _on_cpu(run: Run) -> bool:
    """Every rank computed on CPU: its collectives (gloo) run on the cores it computes on."""
    return bool(run.ranks) and all(r.device == "cpu" for r in run.ranks)


def _contention_top(run: Run, windows: list[Window], durations: list[float]) -> float:
    """The highest per-(rank, window) speed-up if removing the early syncs saved their whole
    time in flight (``saved_ns(in_flight=True)``); ``durations``: the windows' own."""
    flight = saved_ns(run, in_flight=True)
    return max(
        (d / max(1.0, d - flight.get(w.index, 0)) for w, d in zip(windows, durations, strict=True)),
        default=0.0,
    )


def _cpu_reasons(
    run: Run, windows: list[Window], durations: list[float], ratios: list[float]
) -> tuple[list[str], float, bool]:
    """Where the ranks compute on CPU: why the range reaches past the exposed-wait figure or
    is a floor, its top (0.0: not widened) and whether it is a floor."""
    if not (_on_cpu(run) and ratios):
        return [], 0.0, False
    top = _contention_top(run, windows, durations)
    reasons = [CPU_CONTENTION] if top >= max(ratios) + 0.005 else []
    if any(w.kind == "fsdp" for r in run.ranks for w in r.wrappers):
        reasons.append(FSDP_ON_CPU)
    if median(durations) < SHORT_WINDOW_NS:
        reasons.append(SHORT_WINDOWS.format(ms=median(durations) / 1e6))
    floor = len(reasons) > (CPU_CONTENTION in reasons)  # a reason past contention: a floor
    return reasons, top if reasons else 0.0, floor


def projection(
    run: Run, ranks: Iterable[int] | None = None, steady: Steady | None = None
) -> Projection:
    steady = steady if steady is not None else steady_windows(run)
    wanted = None if ranks is None else set(ranks)
    windows = [
        w
        for r in run.ranks
        if wanted is None or r.rank in wanted
        for w in r.windows
        if _complete(w) and w.index in steady.windows
    ]
    saved = saved_ns(run)
    durations = [float(w.duration_ns) for w in windows]
    projected = [float(max(1, w.duration_ns - saved.get(w.index, 0))) for w in windows]
    ratios = [d / p for d, p in zip(durations, projected, strict=True)]
    reasons, top, floor = _cpu_reasons(run, windows, durations, ratios)
    noise = _noise(durations, ratios)
    if noise < 1.0:
        reasons.append(NOISE.format(pct=(1.0 - noise) * 100))
    widened = "; ".join(reasons)
    omitted = ""
    if len(steady.windows) < MIN_STEADY:
        omitted = (
            f"too few steady windows ({len(steady.windows)}; at least {MIN_STEADY} needed, "
            "the first window is warm-up)"
        )
    elif durations:
        saving = median(durations) - median(projected)
        per_window = [
            median([float(w.duration_ns) for w in windows if w.index == i]) for i in steady.windows
        ]
        spread = _quantile(per_window, 0.75) - _quantile(per_window, 0.25)
        if saving <= 0:
            omitted = "no sync time before the last micro-batch was measured"
        elif spread > saving:
            omitted = (
                f"window time varies more than the predicted gain (interquartile range "
                f"{spread / 1e6:.1f} ms vs {saving / 1e6:.1f} ms saved)"
            )
    return Projection(
        window=Stat.of(durations),
        projected=Stat.of(projected),
        speedup=_speedup(durations, projected, ratios, top, noise),
        steady_windows=len(steady.windows),
        basis=BASIS,
        omitted=omitted,
        widened=widened,
        floor=floor,
    )


def measured_speedup(original: Sequence[float], fixed: Sequence[float]) -> Stat | None:
    """The speed-up a fix measured: the original's median window time over the fixed run's,
    with its noise range, each run off by a quartile of its windows the other way (low:
    original q25 / fixed q75; high: q75 / q25). ``n``: the fewer windows of the two."""
    if not original or not fixed or min(fixed) <= 0:
        return None
    q = _quantile
    return Stat(
        median(original) / median(fixed),
        q(original, 0.25) / q(fixed, 0.75),
        q(original, 0.75) / q(fixed, 0.25),
        min(len(original), len(fixed)),
    )


Agreement = Literal["inside", "within noise", "below", "above"]


def judge(measured: Stat, projected: Stat, floor: bool = False) -> Agreement:
    """Where a measured speed-up lies against a projected range, compared as they are printed
    (to 0.01x): ``inside`` it (at or above it for a ``floor``), ``within noise`` where it is
    outside but its noise range overlaps it, else ``below`` or ``above``."""
    low, high = round(projected.low, 2), round(projected.high, 2)
    top = math.inf if floor else high
    at = round(measured.median, 2)
    if low <= at <= top:
        return "inside"
    if round(measured.low, 2) <= top and round(measured.high, 2) >= low:
        return "within noise"
    return "below" if at < low else "above"
