"""Where a run comes from: run directories (with their traces) or Kineto trace files.

Shared by ``profile``, ``analyze``, ``report`` and ``diff`` so every output of the same data
shows the same windows and the same findings.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from pathlib import Path

from syncscope.errors import SyncscopeError
from syncscope.model import Run, compress_ranks
from syncscope.model.flight import FlightDump
from syncscope.rundir import is_run_dir


def load(
    paths: Sequence[Path | str], skip_bad: bool, progress: bool, scheduler: str | None = None
) -> tuple[Run, dict[int, Path]]:
    """The run named by ``paths`` and, where traces were read, their files by rank.
    ``scheduler``: trace files are read on that Dask cluster (a str path: an fsspec URL)."""
    from syncscope.load.traces import load_traces

    run_dirs = [p for p in paths if isinstance(p, Path) and p.is_dir() and is_run_dir(p)]
    if run_dirs and len(run_dirs) != len(paths):
        raise SyncscopeError("give either syncscope run directories or traces, not both")
    if run_dirs:
        from syncscope.load.combine import with_trace_overlap
        from syncscope.load.runs import load_run

        run = load_run(run_dirs)
        traced = [d / "traces" for d in run_dirs if _has_traces(d / "traces")]
        notes = _trace_notes(run_dirs)
        if notes:
            run = dataclasses.replace(
                run, meta=dataclasses.replace(run.meta, notes=(*run.meta.notes, *notes))
            )
        if traced:
            trace_run = load_traces(traced, skip_bad, progress, scheduler=scheduler)
            run = with_trace_overlap(run, trace_run)
        return run, {}
    files: dict[int, Path] = {}  # each rank's file, as the reader matched them (one pass)
    run = load_traces(paths, skip_bad, progress, files_out=files, scheduler=scheduler)
    return run, files


NOT_TRACED = ".not-traced"  # traces/rank-R.not-traced: why its trace is missing or short


def _has_traces(traces: Path) -> bool:
    from syncscope.load.trace.read import is_trace_file

    return traces.is_dir() and any(p.is_file() and is_trace_file(p) for p in traces.iterdir())


def _trace_notes(run_dirs: Sequence[Path]) -> list[str]:
    """Why ``--trace`` left no trace (a rank's own reason, or an empty traces/): the counting
    report stands without one."""
    notes: list[str] = []
    for run_dir in run_dirs:
        traces = run_dir / "traces"
        if not traces.is_dir():
            continue
        by_reason: dict[str, list[int]] = {}
        for path in sorted(traces.glob(f"rank-*{NOT_TRACED}")):
            rank = path.name[len("rank-") : -len(NOT_TRACED)]
            with contextlib.suppress(OSError, UnicodeDecodeError, IndexError):
                if path.is_file() and rank.isdigit():
                    with path.open("rb") as fh:
                        reason = fh.read(1000).decode().strip().splitlines()[0]
                    by_reason.setdefault(reason, []).append(int(rank))
        for reason, ranks in by_reason.items():
            notes.append(f"--trace on rank(s) {compress_ranks(ranks)}: {reason}")
        if not _has_traces(traces):
            notes.append(
                f"--trace: {traces} holds no trace file; the report is syncscope's own count "
                "of the run (no exposed-communication figures)"
            )
    return notes


def split_dumps(paths: Sequence[Path | str]) -> tuple[list[Path | str], list[Path]]:
    """(the other paths, the torch Flight Recorder dumps among them): a dump file given
    alone (or named as the dumps given beside it are), the dumps in a directory (a run
    directory's ``flight/`` too). A directory of dumps
    and Kineto traces gives its trace files; one of dumps only, nothing else."""
    from syncscope.load.flight import dumps_among, find_dumps
    from syncscope.load.trace.read import is_trace_file

    rest: list[Path | str] = []
    dumps: list[Path] = []
    given = set(dumps_among([p for p in paths if isinstance(p, Path) and p.is_file()]))
    for p in paths:
        if not isinstance(p, Path):
            rest.append(p)
        elif p in given:
            dumps.append(p)
        elif p.is_dir() and (found := find_dumps([p])):
            dumps.extend(found)
            if is_run_dir(p):
                rest.append(p)
            else:
                traces = sorted(f for f in p.iterdir() if f.is_file() and is_trace_file(f))
                rest.extend(f for f in traces if f not in found)
        else:
            rest.append(p)
    return rest, dumps


def run_dumps(run_dirs: Sequence[Path]) -> tuple[list[FlightDump], str]:
    """The Flight Recorder dumps the ranks wrote into ``RUN/flight/`` on a hang (``syncscope
    profile``) and, for those that could not be read, why (a note: the run's own report
    stands, with what the readable ones say)."""
    from syncscope.load.flight import find_dumps, read_dumps

    paths = find_dumps([d / "flight" for d in run_dirs if (d / "flight").is_dir()])
    if not paths:
        return [], ""
    skipped: list[str] = []
    try:
        dumps = read_dumps(paths, skipped)
    except SyncscopeError as exc:
        return [], f"Flight Recorder dumps not read: {exc}"
    return dumps, "; ".join(f"Flight Recorder dump not read: {s}" for s in skipped)
