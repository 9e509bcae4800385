"""Which job each trace file is from (``split_jobs``): traces of two jobs are never merged.

A directory may hold the traces of two runs of the same script: same world size, backend
and process groups, so nothing in a file's header tells them apart, and two files of one
rank, or one job's rank 0 next to the other's rank 1, would be compared as one job's ranks
(a rank that "issued nothing" where the other job's rank synced). The traces' own times
tell them apart: the ranks of one job run the same steps at the same time, so their traced
spans overlap. Spans that do not overlap are two jobs when a host has traces on both sides
(one clock: no skew explains a gap) or when the gap is longer than any plausible clock
skew between hosts (``OTHER_HOST_GAP_NS``). Files whose headers differ (world size, backend,
process groups) are of different jobs whatever their times.

One job may also be traced in *cycles*: torch.profiler's ``schedule(..., repeat=N)`` with
``tensorboard_trace_handler`` writes a file per rank per cycle, the later cycles after a gap.
Those files come from the same processes (host and pid), which two runs of a script never
are: spans that do not overlap are one job traced in cycles when every file after the gap
is of a (host, pid) traced before it.
"""

from __future__ import annotations

import datetime
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from syncscope.load.trace.rankfile import Job
from syncscope.model import compress_ranks

SAME_HOST_GAP_NS = 1_000_000_000  # ranks of one job on one clock: spans overlap, give 1 s
OTHER_HOST_GAP_NS = 300_000_000_000  # 5 min: beyond clock skew between synced hosts
_EPOCH_2000_NS = 946_684_800_000_000_000  # earlier "times" are not wall-clock (no base)
_NAMES_SHOWN = 4


@dataclass(frozen=True, slots=True)
class TraceSpan:
    """One accepted trace file: its rank, the job its header names, its host and span."""

    path: Path | str
    rank: int
    job: Job
    host: str
    start_ns: int
    end_ns: int
    pid: int = 0  # the traced process (0: not known)


def split_jobs(traces: Sequence[TraceSpan]) -> list[list[TraceSpan]]:
    """The jobs among ``traces``, each in file order; jobs in order of their first file."""
    # a trace without ``pg_config`` fits the first header of its world size and backend that
    # names process groups
    named: dict[tuple[int, str], Job] = {}
    for trace in traces:
        if trace.job.groups:
            named.setdefault((trace.job.world_size, trace.job.backend), trace.job)
    by_header: dict[Job, list[TraceSpan]] = {}
    for trace in traces:
        job = trace.job
        header = job if job.groups else named.get((job.world_size, job.backend), job)
        by_header.setdefault(header, []).append(trace)
    order = {id(t): i for i, t in enumerate(traces)}
    jobs = [job for group in by_header.values() for job in _by_time(group)]
    jobs = [sorted(job, key=lambda t: order[id(t)]) for job in jobs]
    return sorted(jobs, key=lambda job: order[id(job[0])])


def _by_time(traces: list[TraceSpan]) -> list[list[TraceSpan]]:
    """``traces`` of one header cut where the spans show two jobs (module docstring)."""
    blocks: list[list[TraceSpan]] = []
    end = 0
    for trace in sorted(traces, key=lambda t: t.start_ns):
        if blocks and trace.start_ns <= end + SAME_HOST_GAP_NS:
            blocks[-1].append(trace)
            end = max(end, trace.end_ns)
        else:
            blocks.append([trace])
            end = trace.end_ns
    jobs = blocks[:1]
    for block in blocks[1:]:
        before = jobs[-1]
        gap = block[0].start_ns - max(t.end_ns for t in before)
        shared = {t.host for t in before} & {t.host for t in block} - {""}
        if _same_processes(before, block):
            jobs[-1] = before + block  # a later cycle of the same job
        elif shared or gap > OTHER_HOST_GAP_NS:
            jobs.append(block)
        else:  # different hosts, a gap clock skew may explain: one job
            jobs[-1] = before + block
    return jobs


def _same_processes(before: list[TraceSpan], block: list[TraceSpan]) -> bool:
    """Every file of ``block`` is of a process (host, pid, rank) traced in ``before``."""
    known = {(t.host, t.pid, t.rank) for t in before if t.pid}
    return bool(known) and all((t.host, t.pid, t.rank) in known for t in block)


def cycles_of(spans: Sequence[TraceSpan]) -> bool:
    """Whether ``spans`` (a rank's files in one job) are cycles of one traced process: one
    (host, pid), and each file's span after the one before (a copy of a file overlaps it)."""
    if len({(t.host, t.pid) for t in spans}) != 1 or not all(t.pid for t in spans):
        return False
    ordered = sorted(spans, key=lambda t: t.start_ns)
    return all(a.end_ns < b.start_ns for a, b in itertools.pairwise(ordered))


def chosen(jobs: list[list[TraceSpan]]) -> list[TraceSpan]:
    """The job analyzed with ``--skip-bad``: the most ranks, then the newest."""
    return max(jobs, key=lambda job: (len({t.rank for t in job}), _start(job)))


def _start(job: list[TraceSpan]) -> int:
    return min(t.start_ns for t in job)


def _name(path: Path | str) -> str:
    return path.name if isinstance(path, Path) else path.rsplit("/", 1)[-1]


def describe(job: list[TraceSpan]) -> str:
    """``rank-0.json.gz, rank-1.json.gz [rank(s) 0-1 of 2, gloo, on vm, started ...]``."""
    names = [_name(t.path) for t in job]
    shown = ", ".join(names[:_NAMES_SHOWN])
    if len(names) > _NAMES_SHOWN:
        shown += f", ... ({len(names)} files)"
    header = job[0].job
    parts = [f"rank(s) {compress_ranks([t.rank for t in job])} of {header.world_size}"]
    if header.backend:
        parts.append(header.backend)
    hosts = sorted({t.host for t in job} - {""})
    if hosts:
        parts.append("on " + ", ".join(hosts[:2]) + (", ..." if len(hosts) > 2 else ""))
    start = _start(job)
    if start >= _EPOCH_2000_NS:
        when = datetime.datetime.fromtimestamp(start / 1e9, datetime.UTC)
        parts.append(f"started {when:%Y-%m-%d %H:%M:%S} UTC")
    return f"{shown} [{', '.join(parts)}]"


def where(traces: Sequence[TraceSpan]) -> str:
    """The directory all ``traces`` are in, or ``the traces given``."""
    parents = {str(t.path.parent) if isinstance(t.path, Path) else "" for t in traces}
    return parents.pop() if len(parents) == 1 and "" not in parents else "the traces given"


def mixed_message(jobs: list[list[TraceSpan]]) -> str:
    """One line: the files of each job, and how to analyze one."""
    listed = "; ".join(f"job {i}: {describe(job)}" for i, job in enumerate(jobs, start=1))
    every = [t for job in jobs for t in job]
    return (
        f"{where(every)} holds traces of {len(jobs)} jobs ({listed}): analyze one job at a "
        "time (one directory per job), or give --skip-bad to analyze the one with the most "
        "ranks"
    )
