"""Where a run comes from: run directories (with their traces) or Kineto trace files.

Shared by ``profile``, ``analyze``, ``report`` and ``diff`` so every output of the same data
shows the same windows and the same findings.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from syncscope.errors import BadRunDirectory, SyncscopeError
from syncscope.model import Finding, Run, severity_rank
from syncscope.rundir import is_run_dir


def load(
    paths: Sequence[Path | str], skip_bad: bool, progress: bool, scheduler: str | None = None
) -> tuple[Run, dict[int, Path]]:
    """The run named by ``paths`` and, where traces were read, their files by rank.
    ``scheduler``: trace files are read on that Dask cluster (a str path: an fsspec URL)."""
    from syncscope.trace.load import load_traces

    run_dirs = [p for p in paths if isinstance(p, Path) and p.is_dir() and is_run_dir(p)]
    if run_dirs and len(run_dirs) != len(paths):
        raise SyncscopeError("give either syncscope run directories or traces, not both")
    if run_dirs:
        from syncscope.analysis.assemble import load_run
        from syncscope.analysis.combine import with_trace_overlap

        run = load_run(run_dirs)
        traced = [d / "traces" for d in run_dirs if (d / "traces").is_dir()]
        if traced:
            trace_run = load_traces(traced, skip_bad, progress, scheduler=scheduler)
            run = with_trace_overlap(run, trace_run)
        return run, {}
    files: dict[int, Path] = {}  # each rank's file, as the reader matched them (one pass)
    run = load_traces(paths, skip_bad, progress, files_out=files, scheduler=scheduler)
    return run, files


def findings_for(run: Run, hta: dict[str, Any] | None = None) -> list[Finding]:
    """syncscope's diagnoses plus exposed communication, where a trace measured it."""
    from syncscope.analysis.diagnose import diagnose
    from syncscope.analysis.exposed import exposed_communication

    findings = diagnose(run)
    findings.extend(exposed_communication(run, hta))
    findings.sort(key=lambda f: severity_rank(f.severity))
    return findings


def load_and_diagnose(run_dir: Path) -> tuple[Run, list[Finding]]:
    """Read a saved run and diagnose it: the one path every re-rendering command takes
    (``report``, ``diff``)."""
    if not run_dir.exists():
        raise BadRunDirectory(f"{run_dir}: no such run directory")
    run, _files = load([run_dir], skip_bad=False, progress=False)
    return run, findings_for(run)
