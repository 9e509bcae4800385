"""A live capture and its trace in one report: the live run, with the overlap the trace measured.

``syncscope profile --trace`` leaves ``RUN/traces/rank-R.json.gz`` next to the live capture.
The live capture is the authority on windows and collectives; the trace adds what only it
can measure: communication time, and how much of it compute did not hide. Windows are
matched by rank and window index (the trace's ``syncscope.window#N`` annotations).
"""

from __future__ import annotations

import dataclasses

from syncscope.model import RankRun, Run, Window


def _with(window: Window, traced: Window | None) -> Window:
    if traced is None or traced.comm_ns is None:
        return window
    return dataclasses.replace(
        window,
        comm_ns=traced.comm_ns,
        exposed_comm_ns=traced.exposed_comm_ns,
        compute_ns=traced.compute_ns,
    )


def _spans(indices: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2, 5``."""
    out: list[str] = []
    for i in indices:
        if out and int(out[-1].split("-")[-1]) == i - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ", ".join(out)


def with_trace_overlap(live: Run, traced: Run) -> Run:
    """``live`` with Window.comm_ns / exposed_comm_ns / compute_ns taken from ``traced``."""
    ranks: list[RankRun] = []
    every: set[int] = set()
    measured: set[int] = set()
    for rank in live.ranks:
        other = traced.rank(rank.rank)
        by_index = {w.index: w for w in other.windows if w.complete} if other else {}
        windows = tuple(_with(w, by_index.get(w.index)) for w in rank.windows)
        every.update(w.index for w in rank.windows)
        measured.update(w.index for w in windows if w.comm_ns is not None and w.index in by_index)
        ranks.append(dataclasses.replace(rank, windows=windows))
    if measured >= every:
        note = "communication overlap measured from torch.profiler traces for every window"
    else:
        note = (
            f"communication overlap measured from torch.profiler traces for window(s) "
            f"{_spans(sorted(measured)) or 'none'} of {len(every)}; the other windows were not "
            "traced"
        )
    meta = dataclasses.replace(live.meta, notes=(*live.meta.notes, note))
    return Run(meta=meta, ranks=tuple(ranks))
