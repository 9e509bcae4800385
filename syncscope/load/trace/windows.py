"""Cut one rank's trace events into windows, micro-batches and collectives: a ``RankRun``.

- Windows end at optimizer steps: ``Optimizer.step#...`` spans on the CPU, merged when they
  nest or overlap (real traces nest duplicates; EMA wraps Shampoo), and grouped when no
  backward ran between them (several optimizers close one window).
- Micro-batches: syncscope's own ``syncscope.micro_batch#W.K`` ranges when present; else a
  backward pass (``autograd::engine::evaluate_function:`` activity) after a DDP/FSDP forward
  marker; without any marker, one micro-batch per window and a note saying so.
- Collectives: ``c10d::*`` ops, with size, dtype and process group from the
  ``record_param_comms`` nested in them, else from ``Input Dims``.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from syncscope.load.trace.events import RankEvents, RawCollective, Span, dtype_bytes
from syncscope.load.trace.layouts import model_layouts, several_models_note, split_by_layout
from syncscope.load.trace.overlap import Interval, Measure, measure_windows, merge_pairs
from syncscope.load.trace.packed import Packed
from syncscope.model import (
    GRAD_REDUCING_OPS,
    Collective,
    GradReset,
    Issuer,
    MicroBatch,
    Phase,
    RankRun,
    Window,
    Wrapper,
    WrapperInfo,
    normalize_op,
)

SCALAR_BYTES = 16  # an all-reduce this small after backward is a metric (loss), not gradients
_SKIP_PARAM_COMMS = frozenset({"wait", "barrier", ""})


@dataclass
class _Step:
    start: int
    end: int
    count: int = 1
    busy_ns: int = 0
    skipped: bool = False  # GradScaler skipped optimizer.step(): its update() closes the window


# A window's start, end and the step that closed it (None: the trailing window).
_Bound = tuple[int, int, _Step | None]


@dataclass
class _Micro:
    start: int
    end: int
    bw_start: int | None = None
    bw_end: int | None = None
    wrapper: Wrapper = "none"
    marked: bool = True  # bounded by markers (else: one guessed span per window)


@dataclass
class RankNotes:
    """Plain statements about what this rank's trace could not tell."""

    no_markers: bool = False
    dtype_assumed: bool = False
    backend_only: bool = False
    trailing: bool = False
    own_markers: bool = False
    sizes_unknown: bool = False
    extra: list[str] = field(default_factory=list)


def _skipped_steps(
    steps: list[_Step], updates: list[Span], backward: Sequence[Interval]
) -> list[_Step]:
    """GradScaler's ``update()`` calls with no optimizer step since the last backward before
    them: ``GradScaler.step()`` found inf/NaN and skipped ``optimizer.step()`` (the trace
    has no ``Optimizer.step#`` there), each a step of its own, marked skipped."""
    bw_starts = [b[0] for b in backward]
    step_starts = sorted(s.start for s in steps)
    out: list[_Step] = []
    for u in sorted(updates, key=lambda u: u.start):
        i = bisect_right(bw_starts, u.start)
        if i == 0:
            continue  # no backward before it: nothing was accumulated
        since = bw_starts[i - 1]
        if bisect_right(step_starts, u.start) > bisect_left(step_starts, since):
            continue  # the step was taken: this update follows it
        if out and out[-1].start >= since:
            continue  # one update per window
        out.append(_Step(u.start, u.end, count=0, skipped=True))
    return out


def _steps(
    spans: list[Span], backward: Sequence[Interval], updates: list[Span] | None = None
) -> list[_Step]:
    merged: list[_Step] = []
    for span in sorted(spans, key=lambda s: (s.start, -s.end)):
        if merged and span.start <= merged[-1].end:  # nested duplicate or overlapping
            merged[-1].end = max(merged[-1].end, span.end)
            merged[-1].busy_ns = merged[-1].end - merged[-1].start
            continue
        merged.append(_Step(span.start, span.end, busy_ns=span.end - span.start))
    if updates and merged:  # with no step at all, the optimizer may be one torch never marks
        merged = sorted(
            [*merged, *_skipped_steps(merged, updates, backward)], key=lambda s: s.start
        )
    grouped: list[_Step] = []
    starts = [b[0] for b in backward]
    for s in merged:
        prev = grouped[-1] if grouped else None
        if prev is not None and bisect_right(starts, s.start) == bisect_right(starts, prev.end):
            prev.end, prev.count, prev.busy_ns = s.end, prev.count + 1, prev.busy_ns + s.busy_ns
        else:
            grouped.append(s)
    return grouped


def _resolve(ev: RankEvents, notes: RankNotes) -> list[RawCollective]:
    comms = sorted(ev.collectives, key=lambda c: c.start)
    params = sorted(ev.param_comms, key=lambda p: p.start)
    if not comms:
        named = [p for p in params if p.name not in _SKIP_PARAM_COMMS]
        comms = named or sorted(ev.backend_comms, key=lambda c: c.start)
        notes.backend_only = not named and bool(comms)
        return comms
    by_tid: dict[int, list[RawCollective]] = {}
    for p in params:
        by_tid.setdefault(p.tid, []).append(p)
    starts = {tid: [p.start for p in ps] for tid, ps in by_tid.items()}
    for c in comms:
        if c.tid not in by_tid:
            continue
        i = bisect_left(starts[c.tid], c.start)
        if i < len(by_tid[c.tid]) and by_tid[c.tid][i].start <= c.end:
            p = by_tid[c.tid][i]
            c.nelems = p.nelems if p.nelems is not None else c.nelems
            c.dtype = p.dtype or c.dtype
            c.group_ranks, c.group_name = p.group_ranks, p.group_name
    return comms


def _attach_done(comms: list[RawCollective], ev: RankEvents) -> None:
    starts = [c.start for c in comms]
    launches = ev.comm_launches()
    it = iter(ev.comm_kernels)
    for start, end, corr in zip(it, it, it, strict=True):
        at = launches.get(corr)
        if at is None:
            continue
        i = bisect_right(starts, at) - 1
        if i >= 0 and at <= comms[i].end:
            done = comms[i].done
            comms[i].done = end if done is None else max(done, end)
        del start


class _Sorted:
    """Markers sorted by time, so each window finds its own by bisection (not a scan)."""

    def __init__(self, ev: RankEvents, backward: Sequence[Interval]) -> None:
        self.backward = backward
        self.bw_starts = [b[0] for b in backward]
        self.micro = sorted(ev.micro_marks, key=lambda m: m.start)
        self.micro_starts = [m.start for m in self.micro]
        self.forwards = sorted(f.start for f in ev.forwards)
        self.zero = sorted(ev.zero_grads, key=lambda z: z.start)
        self.zero_starts = [z.start for z in self.zero]
        marks = sorted(((w.start + w.end) // 2, i, w) for i, w in enumerate(ev.window_marks))
        self.mark_mids = [m[0] for m in marks]
        self.marks = [(i, w) for _, i, w in marks]
        self.unnamed = sorted(ev.unnamed)  # events that could not be read, by time

    def window_mark(self, lo: int, hi: int) -> Span | None:
        """The first (in trace order) syncscope.window# mark centred in [lo, hi)."""
        inside = self.marks[bisect_left(self.mark_mids, lo) : bisect_left(self.mark_mids, hi)]
        return min(inside, key=lambda m: m[0])[1] if inside else None


def _micro_batches(idx: _Sorted, lo: int, hi: int, wrapper: Wrapper) -> list[_Micro]:
    bw = idx.backward[bisect_left(idx.bw_starts, lo) : bisect_left(idx.bw_starts, hi)]
    marks = idx.micro[bisect_left(idx.micro_starts, lo) : bisect_left(idx.micro_starts, hi)]
    if marks:
        marked: list[_Micro] = []
        previous = ""
        for mark in marks:
            if mark.name == previous:
                # one micro-batch marked twice: syncscope 0.1.0 marked its forward and its
                # backward as two ranges of the same name
                marked[-1].end = max(marked[-1].end, mark.end)
                continue
            marked.append(_Micro(mark.start, mark.end, wrapper=wrapper))
            previous = mark.name
        for m in marked:
            inside = [b for b in bw if m.start <= b[0] <= m.end]
            if inside:
                m.bw_start, m.bw_end = inside[0][0], max(b[1] for b in inside)
        return marked
    if not bw:
        return []
    forwards = idx.forwards[bisect_left(idx.forwards, lo) : bisect_left(idx.forwards, hi)]
    if not forwards:
        end = max(b[1] for b in bw)
        return [_Micro(bw[0][0], end, bw[0][0], end, marked=False)]
    out: list[_Micro] = []
    for start, end in bw:
        if not out:
            first = forwards[0] if forwards[0] <= start else lo
            out.append(_Micro(first, end, start, end, wrapper))
            continue
        cur = out[-1]
        j = bisect_right(forwards, cur.end)  # the first forward after this backward
        if j < len(forwards) and forwards[j] <= start:
            out.append(_Micro(forwards[j], end, start, end, wrapper))
        else:
            cur.end = cur.bw_end = max(cur.end, end)
    return out


def _phase(t: int, micro: list[_Micro], in_fsdp_reduce: bool) -> tuple[int, Phase]:
    if not micro:
        return 0, "other"
    i = max(0, bisect_right([m.start for m in micro], t) - 1)
    m = micro[i]
    if in_fsdp_reduce:
        return i, "backward"
    if m.bw_start is None or m.bw_end is None or t < m.bw_start:
        return i, "forward" if t >= m.start and m.marked else "other"
    if t <= m.bw_end:
        return i, "backward"
    return i, "after-backward"


def _within(t: int, spans: Sequence[Span]) -> bool:
    return any(s.start <= t <= s.end for s in spans)


def rank_from_trace(ev: RankEvents, meta: dict[str, Any], rank: int, notes: RankNotes) -> RankRun:
    """The RankRun of one trace; ``ev`` must hold at least one optimizer step."""
    base = int(meta.get("baseTimeNanoseconds") or 0)
    backward = merge_pairs(ev.backward)
    steps = _steps(ev.steps, backward, ev.scale_updates)
    wrapper = _wrapper_of(ev)
    notes.no_markers = notes.no_markers or (not ev.micro_marks and not ev.forwards)
    notes.own_markers = notes.own_markers or bool(ev.window_marks)
    comms = _resolve(ev, notes)
    _attach_done(comms, ev)
    bounds, tail_end = _bounds(ev, steps, backward, comms, notes)
    windows = _windows(ev, bounds, _Sorted(ev, backward), comms, wrapper, notes, base)
    layouts = model_layouts(windows)
    models: tuple[WrapperInfo, ...] = ()
    if layouts is not None and wrapper in ("ddp", "fsdp"):
        windows, models = split_by_layout(windows, layouts, wrapper)
        if models:  # (none where two layouts reduce the same total: they read as one job)
            notes.extra.append(several_models_note(layouts))
    return RankRun(
        rank=rank,
        windows=tuple(windows),
        host=str(meta.get("host_name", "")),
        pid=ev.pid or 0,
        device="cuda" if ev.comm_kernels or ev.compute_kernels else "cpu",
        wrappers=models
        or ((WrapperInfo(kind=wrapper, label=_label(wrapper)),) if wrapper != "none" else ()),
        last_event_ns=tail_end + base,
        backend=str((meta.get("distributedInfo") or {}).get("backend", "")),
    )


def _wrapper_of(ev: RankEvents) -> Wrapper:
    """DDP or FSDP, from the forward markers (FSDP2 also from its reduce markers)."""
    names = {f.name for f in ev.forwards}
    if "DistributedDataParallel.forward" in names:
        return "ddp"
    if names or ev.fsdp_reduces:
        return "fsdp"
    return "none"


def _bounds(
    ev: RankEvents,
    steps: list[_Step],
    backward: Sequence[Interval],
    comms: list[RawCollective],
    notes: RankNotes,
) -> tuple[list[_Bound], int]:
    """Each window's (start, end, step): from the trace's start (or first collective) to the
    end of each step, and a trailing window for activity after the last; and the trace's end."""
    extent = ev.extent(backward) or (steps[0].start, steps[-1].end)
    first = min([extent[0], *(c.start for c in comms[:1])])
    bounds: list[_Bound] = []
    lo = first
    for s in steps:
        bounds.append((lo, s.end, s))
        lo = s.end
    tail_end = max(extent[1], lo)
    # (both in start order: the last starts latest)
    if (comms and comms[-1].start >= lo) or (backward and backward[-1][0] >= lo):
        bounds.append((lo, tail_end, None))
        notes.trailing = True
    return bounds, tail_end


def _windows(
    ev: RankEvents,
    bounds: list[_Bound],
    idx: _Sorted,
    comms: list[RawCollective],
    wrapper: Wrapper,
    notes: RankNotes,
    base: int,
) -> list[Window]:
    """The windows of ``bounds``, their collectives and micro-batches packed into columns
    (a few dozen bytes a collective instead of a few hundred)."""
    measures = measure_windows(ev, [(a, b) for a, b, _ in bounds])
    all_collectives: list[Collective] = []
    all_micro: list[MicroBatch] = []
    spans: list[tuple[int, int, int, int, dict[str, Any]]] = []  # collectives, micro-batches
    ci = 0
    # Equal values share one object (names, sizes, groups): a rank's thousands of
    # collectives repeat a handful of them, and the Run holds every rank's.
    shared: dict[Any, Any] = {}
    for index, (lo, hi, step) in enumerate(bounds):
        micro = _micro_batches(idx, lo, hi, wrapper)
        first_collective, first_micro = len(all_collectives), len(all_micro)
        while (ci < len(comms) and comms[ci].start < hi) or (step is None and ci < len(comms)):
            raw = comms[ci]
            col = _collective(raw, ci, micro, step, wrapper, ev, notes, base, shared)
            all_collectives.append(col)
            ci += 1
        all_micro.extend(
            MicroBatch(k, mb.start + base, mb.end + base, mb.wrapper, None, None)
            for k, mb in enumerate(micro)
        )
        measure = measures[index] if measures else None
        fields = _window_fields(idx, index, (lo, hi, step), micro, measure, base, shared)
        spans.append((first_collective, len(all_collectives), first_micro, len(all_micro), fields))
    collectives = Packed.of(Collective, all_collectives)
    micro_batches = Packed.of(MicroBatch, all_micro)
    return [
        Window(
            collectives=collectives.view(c0, c1),
            micro_batches=micro_batches.view(m0, m1),
            **fields,
        )
        for c0, c1, m0, m1, fields in spans
    ]


def _window_fields(
    idx: _Sorted,
    index: int,
    bound: _Bound,
    micro: list[_Micro],
    measure: Measure | None,
    base: int,
    shared: dict[Any, Any],
) -> dict[str, Any]:
    """A Window's fields but its collectives and micro-batches."""
    lo, hi, step = bound
    zero = idx.zero[bisect_left(idx.zero_starts, lo) : bisect_left(idx.zero_starts, hi)]
    resets = tuple(
        GradReset(sum(1 for m in micro if m.end <= z.start), "optimizer.zero_grad")
        for z in zero
        if not (step and step.start <= z.start <= step.end)
    )
    mark = idx.window_mark(lo, hi)
    return dict(
        index=int(mark.name.rsplit("#", 1)[1]) if mark else index,
        complete=step is not None,
        start_ns=lo + base,
        end_ns=hi + base,
        grad_resets=shared.setdefault(("resets", resets), resets),
        steps=step.count if step else 0,
        step_skipped=bool(step and step.skipped),
        step_ns=step.busy_ns if step else 0,
        comm_ns=measure.comm if measure else None,
        exposed_comm_ns=measure.exposed if measure else None,
        compute_ns=measure.compute if measure else None,
        records_dropped=bisect_left(idx.unnamed, hi) - bisect_left(idx.unnamed, lo),
    )


def _label(wrapper: Wrapper) -> str:
    return "DistributedDataParallel" if wrapper == "ddp" else "FullyShardedDataParallel"


def _collective(
    raw: RawCollective,
    seq: int,
    micro: list[_Micro],
    step: _Step | None,
    wrapper: Wrapper,
    ev: RankEvents,
    notes: RankNotes,
    base: int,
    shared: dict[Any, Any],
) -> Collective:
    """One Collective; times shifted by ``base`` to the wall clock."""
    op = normalize_op(raw.name)
    in_reduce = _within(raw.start, ev.fsdp_reduces)
    position, phase = _phase(raw.start, micro, in_reduce)
    if step is not None and step.start <= raw.start <= step.end:
        phase = "optimizer"
    size = dtype_bytes(raw.dtype) if raw.dtype else None
    if raw.nelems is not None and size is None:
        notes.dtype_assumed = True
    if raw.nelems is None:
        notes.sizes_unknown = True
    nbytes = (raw.nelems or 0) * (size or 4)
    integer = any(k in (raw.dtype or "").lower() for k in ("int", "long", "bool"))
    grad = (
        op in GRAD_REDUCING_OPS
        and not integer  # DDP's used-parameter map (find_unused_parameters) is an int tensor
        and (phase == "backward" or (phase == "after-backward" and nbytes > SCALAR_BYTES))
    )
    issuer: Issuer = "user"
    if in_reduce or (wrapper == "fsdp" and op in ("all_gather", "reduce_scatter")):
        issuer = "fsdp"
    elif wrapper == "ddp" and (
        (grad and phase == "backward") or (op == "broadcast" and phase == "forward")
    ):
        issuer = "ddp"
    dtype = raw.dtype or "unknown"
    return Collective(
        seq=seq,
        op=op,
        raw_op=shared.setdefault(raw.name, raw.name),
        bytes=shared.setdefault(nbytes, nbytes),
        dtype=shared.setdefault(dtype, dtype),
        group_ranks=shared.setdefault(raw.group_ranks, raw.group_ranks),
        group_name=shared.setdefault(raw.group_name, raw.group_name),
        start_ns=raw.start + base,
        end_ns=raw.end + base,
        done_ns=None if raw.done is None else raw.done + base,
        phase=phase,
        micro_batch=position,
        grad_sync=grad,
        issuer=issuer,
        module=_label(wrapper) if issuer in ("ddp", "fsdp") else "",
    )
