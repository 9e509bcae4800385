"""``load_traces``: Kineto trace files or directories (one per node) -> one ``Run``.

Files are read one at a time and reduced to a ``RankRun`` before the next is opened, so
memory follows the largest single file, not the job. Each problem names the file; with
``skip_bad`` the file is left out and the run's notes say so.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from syncscope.errors import BadTrace
from syncscope.load.trace.jobs import (
    TraceSpan,
    chosen,
    cycles_of,
    describe,
    mixed_message,
    split_jobs,
)
from syncscope.load.trace.rankfile import Job, RankResult, read_rank
from syncscope.load.trace.read import collector_paused, is_trace_file
from syncscope.load.trace.windows import RankNotes
from syncscope.model import RankRun, Run, RunMeta, compress_ranks, missing_ranks_text

Source = Path | str  # a local file, or an fsspec URL (read on a Dask cluster)
PROGRESS_MIN_BYTES = 64 << 20
PARALLEL_MIN_BYTES = 32 << 20  # below this (on disk), worker start-up costs more than it saves
MAX_WORKERS = 2  # worker processes, beside this one (which reads files too)
WORKERS_ENV = "SYNCSCOPE_TRACE_WORKERS"  # force a worker count (0: read in this process)


def trace_files(paths: Sequence[Path]) -> list[Path]:
    """The trace files named by ``paths`` (files, or directories holding them)."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and is_trace_file(p))
            if not found and (path / "traces").is_dir():
                found = sorted(p for p in (path / "traces").iterdir() if is_trace_file(p))
            if not found:
                raise BadTrace(f"{path}: no trace files (*.json, *.json.gz) in this directory")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise BadTrace(f"{path}: no such file or directory")
    return files


def _sources(paths: Sequence[Path | str], scheduler: str | None) -> tuple[list[Source], list[int]]:
    """The trace files named by ``paths`` and their sizes; URLs (read on a Dask cluster's
    workers) only with a scheduler."""
    files: list[Source] = []
    sizes: list[int] = []
    for path in paths:
        if isinstance(path, str) and "://" in path:
            if scheduler is None:
                raise BadTrace(f"{path}: a URL is read by Dask workers: give --scheduler")
            from syncscope.load.trace.cluster import url_files

            for url, size in url_files(path):
                files.append(url)
                sizes.append(size)
            continue
        local = trace_files([Path(path)])
        files.extend(local)
        sizes.extend(p.stat().st_size for p in local)
    return files, sizes


@contextmanager
def _progress(sizes: list[int], enabled: bool) -> Iterator[Callable[[int], None] | None]:
    size = sum(sizes)
    if not enabled or size < PROGRESS_MIN_BYTES:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    console = Console(stderr=True)
    if not console.is_terminal:
        yield None
        return
    columns = ("reading traces", BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("traces", total=size)
        yield lambda n: bar.advance(task, n)


def _merge_flags(into: RankNotes, rank: RankNotes) -> None:
    """Fold one rank's notes into the run's, as one shared RankNotes would have been set."""
    into.no_markers = into.no_markers or rank.no_markers
    into.own_markers = into.own_markers or rank.own_markers
    into.trailing = into.trailing or rank.trailing
    into.dtype_assumed = into.dtype_assumed or rank.dtype_assumed
    into.sizes_unknown = into.sizes_unknown or rank.sizes_unknown
    into.backend_only = rank.backend_only  # the last rank read decides, as before
    into.extra.extend(line for line in rank.extra if line not in into.extra)


def worker_count(sizes: Sequence[int]) -> int:
    """Worker processes for files of ``sizes`` (bytes on disk), beside this process, which
    reads files too: none (0) for one file or a small job."""
    forced = os.environ.get(WORKERS_ENV, "").strip()
    if forced:
        return max(0, int(forced)) if len(sizes) > 1 else 0
    if len(sizes) < 2 or sum(sizes) < PARALLEL_MIN_BYTES:
        return 0
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return min(MAX_WORKERS, cores - 1, len(sizes) - 1)


def _results(
    files: list[Source],
    sizes: list[int],
    scheduler: str | None,
    advance: Callable[[int], None] | None,
) -> Iterator[RankResult]:
    if scheduler is not None:
        from syncscope.load.trace.cluster import cluster_results

        yield from cluster_results(files, sizes, scheduler, advance)
        return
    local = [Path(f) for f in files]
    workers = worker_count(sizes)
    if workers < 1:
        for path in local:
            yield read_rank(path, advance)
        return
    from syncscope.load.trace.worker import Pool

    with Pool(workers) as pool:
        yield from pool.map(local, advance, sizes)


def load_traces(
    paths: Sequence[Path | str],
    skip_bad: bool = False,
    progress: bool = False,
    files_out: dict[int, Path] | None = None,
    scheduler: str | None = None,
) -> Run:
    """Read every trace named by ``paths`` into one Run (``source="trace"``); ``files_out``,
    where given, receives each rank's local file (the rank the trace itself names).
    ``scheduler``: read on that Dask cluster (load/trace/cluster.py), where paths may be URLs.

    Files are read in worker processes (``worker_count``), and in this one beside them, when
    there are several large ones; each worker sends back only the rank's ``RankResult``.
    Results are checked in file order either way, so errors and notes do not depend on which
    worker finished first.
    """
    files, sizes = _sources(paths, scheduler)
    notes: list[str] = []
    skipped: list[str] = []
    traces: list[tuple[TraceSpan, RankRun]] = []
    flags = RankNotes()
    with collector_paused(), _progress(sizes, progress) as advance:
        results = _results(files, sizes, scheduler, advance)
        try:
            for result in results:
                try:
                    rank_run, this_job = _check(result, notes)
                except BadTrace as exc:
                    if not skip_bad:
                        raise
                    skipped.append(str(exc))
                    continue
                _merge_flags(flags, result.flags)
                traces.append((_span(result.path, rank_run, this_job), rank_run))
        finally:
            close = getattr(results, "close", None)
            if close is not None:
                close()  # stops the workers when a bad file ends the load early
    if not traces:
        detail = f": {skipped[0]}" if skipped else ""
        raise BadTrace(f"no usable trace among {len(files)} file(s){detail}")
    ranks = _one_job(traces, skip_bad, skipped, notes)
    world = next(iter(ranks.values()))[2].world_size
    present = sorted(ranks)
    notes.extend(_notes(flags, present, world))
    notes.extend(f"skipped {s}" for s in skipped)
    hosts = tuple(sorted({r.host for r, _, _ in ranks.values() if r.host}))
    meta = RunMeta(world_size=world, nodes=hosts, source="trace", notes=tuple(notes))
    if files_out is not None:
        files_out.update((r, p) for r in present if isinstance(p := ranks[r][1], Path))
    return Run(meta=meta, ranks=tuple(ranks[r][0] for r in present))


def _span(path: Path | str, rank_run: RankRun, job: Job) -> TraceSpan:
    start = rank_run.windows[0].start_ns if rank_run.windows else rank_run.last_event_ns
    end = max([rank_run.last_event_ns, *(w.end_ns for w in rank_run.windows[-1:])])
    return TraceSpan(path, rank_run.rank, job, rank_run.host, start, end, rank_run.pid)


def _one_job(
    traces: list[tuple[TraceSpan, RankRun]], skip_bad: bool, skipped: list[str], notes: list[str]
) -> dict[int, tuple[RankRun, Path | str, Job]]:
    """The ranks of the one job analyzed: traces of several jobs are refused (with
    ``skip_bad``: the job with the most ranks is kept, the others named in ``skipped``);
    a rank twice in one job likewise, in file order, unless its files are cycles of one
    traced process (torch.profiler's schedule with ``repeat``): those are read as one."""
    runs = {id(span): run for span, run in traces}
    jobs = split_jobs([span for span, _ in traces])
    kept = jobs[0]
    if len(jobs) > 1:
        if not skip_bad:
            raise BadTrace(mixed_message(jobs))
        kept = chosen(jobs)
        skipped.extend(
            f"{describe(job)}: from a different job than the one analyzed ({describe(kept)})"
            for job in jobs
            if job is not kept
        )
    ranks: dict[int, tuple[RankRun, Path | str, Job]] = {}
    spans: dict[int, list[TraceSpan]] = {}
    for span in kept:
        if span.rank in ranks and cycles_of([*spans[span.rank], span]):
            spans[span.rank].append(span)  # a later cycle of the same process
            continue
        if span.rank in ranks:
            exc = BadTrace(
                f"{span.path}: rank {span.rank} appears twice (also in {ranks[span.rank][1]})"
            )
            if not skip_bad:
                raise exc
            skipped.append(str(exc))
            continue
        ranks[span.rank] = (runs[id(span)], span.path, span.job)
        spans[span.rank] = [span]
    cycled = sorted(rank for rank, files in spans.items() if len(files) > 1)
    for rank in cycled:
        in_order = sorted(spans[rank], key=lambda t: t.start_ns)
        first = ranks[rank]
        ranks[rank] = (_in_cycles([runs[id(t)] for t in in_order]), first[1], first[2])
    if cycled:
        counts = sorted({len(spans[r]) for r in cycled})
        notes.append(
            f"rank(s) {compress_ranks(cycled)} traced in {'/'.join(map(str, counts))} cycles "
            "(one process each: torch.profiler's schedule with repeat): read as one job, "
            "their windows in order"
        )
    return ranks


def _in_cycles(runs: list[RankRun]) -> RankRun:
    """One rank's traces of successive profiler cycles as one RankRun: each cycle's complete
    windows in order, numbered on; the last cycle's trailing window, if any, at the end."""
    windows = [w for run in runs[:-1] for w in run.windows if w.complete]
    windows += list(runs[-1].windows)
    last = runs[-1]
    return dataclasses.replace(
        last,
        windows=tuple(dataclasses.replace(w, index=i) for i, w in enumerate(windows)),
        wrappers=last.wrappers or runs[0].wrappers,
    )


def _check(result: RankResult, notes: list[str]) -> tuple[RankRun, Job]:
    """The checks of one file on its own, in the order a sequential read made them (the
    files are checked against each other once all are read: ``_one_job``)."""
    path = result.path
    if result.job is None or result.rank is None:
        raise BadTrace(result.error)
    this_job = result.job
    rank = result.rank
    notes.extend(result.rank_notes)
    if rank >= this_job.world_size and result.has_info:
        raise BadTrace(f"{path}: rank {rank} outside world size {this_job.world_size}")
    if result.rank_run is None:
        raise BadTrace(
            f"{path}: no optimizer steps (no 'Optimizer.step#...' annotation): "
            "cannot cut the trace into windows"
        )
    return result.rank_run, this_job


def _notes(flags: RankNotes, present: list[int], world: int) -> list[str]:
    out: list[str] = []
    if flags.no_markers:
        out.append(
            "no micro-batch markers in the trace (no DDP/FSDP forward or syncscope "
            "annotations): each window's collectives are counted as micro-batch 0, and how "
            "many micro-batches a window had is unknown"
        )
    if flags.backend_only:
        out.append("no c10d ops in the trace: collectives counted from backend annotations")
    if flags.dtype_assumed:
        out.append("some collectives have no recorded dtype: their bytes assume 4-byte elements")
    if flags.sizes_unknown:
        out.append(
            "some collectives have no recorded size (trace made without record_shapes and "
            "without record_param_comms sizes): their bytes read 0, meaning unknown"
        )
    if flags.trailing:
        out.append("activity after the last optimizer step is reported as an incomplete window")
    if not flags.own_markers:
        out.append(
            "the first window starts where the trace starts: micro-batches before the "
            "profiler started are not seen"
        )
    missing, _ = missing_ranks_text(present, world)
    if missing:
        out.append(
            f"traces of rank(s) {compress_ranks(present)} of {world} only: cross-rank checks "
            f"cover those ranks; rank(s) {missing} were not seen"
        )
    return out + flags.extra
