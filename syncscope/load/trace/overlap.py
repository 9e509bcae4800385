"""Exposed communication: collective time not overlapped with compute, per window.

GPU traces: communication is the union of NCCL kernels, compute the union of the other
kernels (memcpy/memset are neither), the rule HTA's ``get_comm_comp_overlap`` uses; a
kernel belongs to the window its start falls in.
CPU traces: communication is the union of the backend's work (``gloo:*`` annotations on
its worker threads, else the ``c10d::*`` calls), compute the union of the other CPU ops,
clipped to the window's span. ``hta_overlap`` runs HTA itself (opt-in, ``--hta``).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from itertools import compress
from operator import itemgetter, le, lt
from pathlib import Path
from typing import Any

from syncscope.load.trace.events import RankEvents, in_order, parts

Interval = tuple[int, int]
# merged intervals (sorted, disjoint) as their starts and their ends: the form measured,
# which needs no tuple for each of a window's hundreds of kernels
Merged = tuple[Sequence[int], Sequence[int]]
_START, _END = itemgetter(0), itemgetter(1)


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint union of ``intervals``."""
    out: list[Interval] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def merge_pairs(flat: Sequence[int]) -> list[Interval]:
    """``merge`` of intervals stored flat (start, end, start, end, ...), as the reader keeps
    them. In start order with none overlapping the next (a thread's backward ops, as traces
    list them), runs that touch are joined by passes in C over a part of them at a time
    (``PART`` values: a 1 GB trace has a million backward ops, most of them touching);
    else the merging loop, over them sorted."""
    run_starts: list[int] = []
    run_ends: list[int] = []
    for values in parts(flat):  # (PART is even: whole intervals)
        starts, ends = values[0::2], values[1::2]
        joined = _joined(starts, ends, 0, len(starts)) if starts == sorted(starts) else None
        if joined is None:
            return _merge_sorted(flat)
        s, e = joined
        if run_ends and s[0] <= run_ends[-1]:
            if s[0] < run_ends[-1]:  # overlaps the part before
                return _merge_sorted(flat)
            run_ends[-1] = e[0]  # touches it: one run
            s, e = s[1:], e[1:]
        run_starts.extend(s)
        run_ends.extend(e)
    return list(zip(run_starts, run_ends, strict=True))


def _merge_sorted(flat: Sequence[int]) -> list[Interval]:
    """``merge_pairs`` of intervals out of order, or overlapping."""
    starts, ends = flat[0::2], flat[1::2]
    if not in_order(starts):
        order = sorted(range(len(starts)), key=starts.__getitem__)
        starts = array("q", map(starts.__getitem__, order))
        ends = array("q", map(ends.__getitem__, order))
    joined = _joined(starts, ends, 0, len(starts))
    if joined is not None:
        return list(zip(*joined, strict=True))
    return _merge_loop(starts, ends, 0, len(starts))


def total(merged: Sequence[Interval]) -> int:
    ends: int = sum(map(_END, merged))  # (C-level sums: no loop in Python)
    starts: int = sum(map(_START, merged))
    return ends - starts


def subtract(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Parts of merged ``a`` not covered by merged ``b``."""
    return list(_uncovered(_columns(a), _columns(b)))


def _uncovered(a: Merged, b: Merged) -> Iterator[Interval]:
    """``subtract`` of columns. Each interval of ``a`` finds the first of ``b`` that can
    cover it by bisection: ``a`` (communication) is usually a few intervals, ``b`` (compute)
    hundreds, most of them between them."""
    b_starts, b_ends = b
    n = len(b_starts)
    for start, end in zip(*a, strict=True):
        cur = start
        k = bisect_right(b_ends, cur)  # the first that ends after cur
        while k < n and b_starts[k] < end:
            if b_starts[k] > cur:
                yield (cur, b_starts[k])
            cur = max(cur, b_ends[k])
            if cur >= end:
                break
            k += 1
        if cur < end:
            yield (cur, end)


def clip(merged: Sequence[Interval], lo: int, hi: int) -> list[Interval]:
    out: list[Interval] = []
    for start, end in merged:
        if end <= lo or start >= hi:
            continue
        out.append((max(start, lo), min(end, hi)))
    return out


class Measure:
    """Comm, exposed comm and compute (ns) of one window, from their merged intervals."""

    __slots__ = ("comm", "compute", "exposed")

    def __init__(self, comm: Merged, compute: Merged) -> None:
        self.comm = sum(comm[1]) - sum(comm[0])  # (C-level sums: no loop in Python)
        self.compute = sum(compute[1]) - sum(compute[0])
        self.exposed = sum(end - start for start, end in _uncovered(comm, compute))


def _columns(merged: Sequence[Interval]) -> Merged:
    return list(map(_START, merged)), list(map(_END, merged))


def _view(values: Sequence[int]) -> Sequence[int]:
    """``values`` to slice without a copy (an array's memoryview; a list as it is)."""
    return memoryview(values) if isinstance(values, array) else values


def _by_window(kernels: array[int], width: int, spans: Sequence[Interval]) -> list[array[int]]:
    """Per window span, the indices (into the records of ``width`` values, start and end
    first) of the kernels that start in it: 8 bytes a kernel, where tuples for every kernel
    would cost ~120."""
    bounds = [lo for lo, _ in spans]
    last = spans[-1][1]
    out: list[array[int]] = [array("q") for _ in spans]
    for k, start in enumerate(kernels[0::width]):
        i = bisect_right(bounds, start) - 1
        if i >= 0 and start <= last:
            out[i].append(k)
    return out


def _intervals(kernels: array[int], width: int, indices: array[int]) -> Merged:
    return _columns(merge((kernels[width * k], kernels[width * k + 1]) for k in indices))


def _kernels_by_window(
    kernels: array[int], width: int, spans: Sequence[Interval]
) -> Iterator[Merged]:
    """Per window span, in turn, the merged intervals of the kernels (records of ``width``
    values, start and end first) that start in it (from its start to the next span's; the
    last to its end): one window's at a time, as each is measured and let go. Kernels in
    start order, as traces list them, are one slice per window, merged in one pass; others
    are sorted first (``_by_window``)."""
    spans_in_order = in_order([lo for lo, _ in spans])
    if width == 2 and spans_in_order and in_order(kernels):
        # in start order, none overlapping the next (one stream, as usual): each window's
        # kernels are a slice, measured as they are (kernels that touch, or take no time,
        # count what their union would), made a list of ints one window at a time
        with memoryview(kernels) as view:

            def window(i: int, j: int) -> Merged:
                flat = view[2 * i : 2 * j].tolist()
                return flat[0::2], flat[1::2]

            yield from _slices(view[0::2], spans, window)
        return
    starts, ends = kernels[0::width], kernels[1::width]
    if not spans_in_order or not in_order(starts):
        for indices in _by_window(kernels, width, spans):
            yield _intervals(kernels, width, indices)
        return
    yield from _slices(starts, spans, partial(_merged_columns, starts, ends))


def _slices(
    starts: Sequence[int], spans: Sequence[Interval], merged: Callable[[int, int], Merged]
) -> Iterator[Merged]:
    """``merged(i, j)`` of each window's kernels ``i`` to ``j``, their starts in order."""
    cuts = [bisect_left(starts, lo) for lo, _ in spans[1:]]
    cuts.append(bisect_right(starts, spans[-1][1]))
    first = bisect_left(starts, spans[0][0])
    for last in cuts:
        yield merged(first, last)
        first = last


def _merged_columns(starts: Sequence[int], ends: Sequence[int], i: int, j: int) -> Merged:
    """The merged intervals ``i`` to ``j`` (exclusive, their starts in order), as columns."""
    joined = _joined(starts, ends, i, j)
    return joined if joined is not None else _columns(_merge_loop(starts, ends, i, j))


def _joined(starts: Sequence[int], ends: Sequence[int], i: int, j: int) -> Merged | None:
    """The union of intervals ``i`` to ``j`` (their starts in order) where none overlaps the
    next (kernels of one stream, a thread's backward ops): runs of intervals that touch
    are joined, without a loop in Python; where they are all apart, views of the columns
    themselves. None where some overlap (or are empty): those take ``_merge_loop``."""
    s, e = _view(starts)[i:j], _view(ends)[i:j]
    if not all(map(lt, s, e)):
        return None
    before, after = e[:-1], s[1:]
    gaps = list(map(lt, before, after))  # True: interval k + 1 starts a new run
    if all(gaps):
        return s, e
    if not all(map(le, before, after)):
        return None
    run_starts = [s[0], *compress(after, gaps)]
    run_ends = [*compress(before, gaps), e[-1]]
    return run_starts, run_ends


def _merge_loop(starts: Sequence[int], ends: Sequence[int], i: int, j: int) -> list[Interval]:
    out: list[Interval] = []
    for k in range(i, j):
        start, end = starts[k], ends[k]
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def measure_windows(ev: RankEvents, spans: Sequence[Interval]) -> list[Measure] | None:
    """One Measure per window span (trace clock, ns); None when nothing can be measured."""
    if not spans:
        return []
    if ev.comm_kernels or ev.compute_kernels:
        return [
            Measure(c, k)
            for c, k in zip(
                _kernels_by_window(ev.comm_kernels, 3, spans),
                _kernels_by_window(ev.compute_kernels, 2, spans),
                strict=True,
            )
        ]
    comm_src = [(c.start, c.end) for c in ev.backend_comms] or [
        (c.start, c.end) for c in ev.collectives
    ]
    if not comm_src:
        return None
    comm_all = merge(comm_src)
    comp_all = merge_pairs(ev.cpu_compute)
    return [
        Measure(_columns(clip(comm_all, lo, hi)), _columns(clip(comp_all, lo, hi)))
        for lo, hi in spans
    ]


def hta_overlap(files: dict[int, Path]) -> dict[str, Any]:
    """HTA's comm/comp overlap and temporal breakdown per rank (slow: HTA's own load)."""
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        return {"error": "HTA is not installed (pip install traceinsight)"}
    import logging

    logging.getLogger("hta").setLevel(logging.ERROR)
    try:
        analysis = TraceAnalysis(trace_files={r: str(p) for r, p in files.items()}, trace_dir="")
        overlap = analysis.get_comm_comp_overlap(visualize=False)
        breakdown = analysis.get_temporal_breakdown(visualize=False)
    except Exception as exc:  # HTA raises bare errors on CPU-only traces
        return {"error": f"HTA could not analyse these traces: {type(exc).__name__}: {exc}"}
    return {
        "comm_comp_overlap_pct": {
            int(r): float(v) for r, v in zip(overlap["rank"], overlap.iloc[:, 1], strict=True)
        },
        "temporal_breakdown": [
            {str(k): (float(v) if isinstance(v, (int, float)) else str(v)) for k, v in row.items()}
            for row in breakdown.to_dict(orient="records")
        ],
    }
