"""Read one rank's Kineto trace file and reduce it to a ``RankResult`` (``read_rank``).

Run in this process or in a worker (``syncscope.load.trace.worker``), whose result goes back to
``load_traces`` (``syncscope.load.traces``), which checks the files against each other.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from syncscope.errors import BadTrace, SyncscopeError
from syncscope.fields import field_int, field_of, field_str
from syncscope.load.trace.events import RankEvents, decode_events
from syncscope.load.trace.packed import forget_made
from syncscope.load.trace.read import Opener, collector_paused, read_trace
from syncscope.load.trace.windows import RankNotes, rank_from_trace
from syncscope.model import RankRun

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)")


@dataclass(frozen=True)
class Job:
    """The job a trace says it is from: files of different jobs are not analyzed together."""

    world_size: int
    backend: str
    groups: tuple[tuple[str, int], ...]

    def describe(self) -> str:
        return f"world size {self.world_size}, backend {self.backend or '?'}"


def job_of(info: dict[str, Any], path: Path | str = "trace") -> Job:
    where = path
    configs = field_of(
        info, "pg_config", where, list, default=[], label="distributedInfo.pg_config"
    )
    groups: list[tuple[str, int]] = []
    for i, g in enumerate(configs):
        label = f"distributedInfo.pg_config[{i}]"
        field_of({label: g}, label, where, dict)
        size = field_int(g, "pg_size", where, default=0, label=f"{label}.pg_size")
        groups.append((str(g.get("pg_name", "")), size))
    world = field_int(
        info, "world_size", where, min=1, default=1, label="distributedInfo.world_size"
    )
    backend = field_str(info, "backend", where, default="", label="distributedInfo.backend")
    return Job(world, backend, tuple(sorted(groups)))


def _rank_of(path: Path, info: dict[str, Any], notes: list[str]) -> int:
    rank = field_int(info, "rank", path, default=None, label="distributedInfo.rank")
    if rank is not None:
        return int(rank)
    m = _RANK_IN_NAME.search(path.name)
    if m is None:
        raise BadTrace(f"{path}: no 'distributedInfo' rank and none in the file name")
    notes.append(
        f"{path.name}: no 'distributedInfo' in the trace; rank {m.group(1)} taken from the file name"
    )
    return int(m.group(1))


@dataclass
class RankResult:
    """What reading one file gives, checked against the other files by ``load_traces``.

    Small enough to send from a worker process: the events themselves stay in the worker.
    """

    path: Path | str  # a str: an fsspec URL, read on a Dask worker (load/trace/cluster.py)
    job: Job | None = None
    has_info: bool = False
    rank: int | None = None
    rank_notes: list[str] = field(default_factory=list)
    rank_run: RankRun | None = None
    flags: RankNotes = field(default_factory=RankNotes)
    error: str = ""  # a BadTrace met while reading (corrupt file, no rank)


def read_rank(
    path: Path, advance: Callable[[int], None] | None = None, opener: Opener | None = None
) -> RankResult:
    """Read one trace file and reduce it to its ``RankRun`` (in this process). ``opener``:
    the bytes to read instead of the file ``path`` (an fsspec URL's object, streamed)."""
    with collector_paused():
        return _read_rank(path, advance, opener)


def _read_rank(
    path: Path, advance: Callable[[int], None] | None, opener: Opener | None
) -> RankResult:
    result = RankResult(path)
    try:
        events = RankEvents()
        meta = read_trace(path, events, advance, opener, decode_events)
        info = field_of(meta, "distributedInfo", path, dict, default={}, error=BadTrace)
        field_int(meta, "baseTimeNanoseconds", path, default=0, error=BadTrace)
        _check_events(path, events, result.rank_notes)
        result.job, result.has_info = job_of(info, path), bool(info)
        result.rank = _rank_of(path, info, result.rank_notes)
    except SyncscopeError as exc:
        result.error = str(exc)
        return result
    if events.steps and (result.rank < result.job.world_size or not info):
        result.rank_run = rank_from_trace(events, meta, result.rank, result.flags)
        forget_made()  # rows made while building the rank: not kept for the analysis
    return result


def _check_events(path: Path, events: RankEvents, notes: list[str]) -> None:
    """Entries that could not be placed: an error where they hide collectives, else a note."""
    if events.not_objects:
        raise BadTrace(
            f"{path}: traceEvents holds {events.not_objects} entries that are not objects"
        )
    if events.unplaced_comms:
        raise BadTrace(
            f"{path}: {events.unplaced_comms} collective event(s) without a usable time (ts "
            "missing or not a finite time, or dur negative): this rank's syncs cannot be counted"
        )
    if events.unnamed:
        notes.append(
            f"{path.name}: {len(events.unnamed)} event(s) whose name is not a string were "
            "dropped; no finding is drawn from the windows that held them"
        )
    if events.unplaced:
        notes.append(
            f"{path.name}: {events.unplaced} event(s) without a usable time (ts missing or not "
            "a finite time, or dur negative) were skipped"
        )
