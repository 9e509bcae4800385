"""``syncscope analyze PATH [PATH ...]``: report on saved runs or torch.profiler traces.

PATH is a syncscope run directory, a directory of Kineto traces, or trace files; several
directories (one per node) are merged into one job. Output as ``profile``: the terminal
summary, ``report.json`` and the report files.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from syncscope.errors import SyncscopeError

if TYPE_CHECKING:
    from syncscope.model import Finding, Run


def _is_run_dir(path: Path) -> bool:
    meta = path / "meta.json"
    if not meta.is_file():
        return False
    try:
        import orjson

        data = orjson.loads(meta.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == "syncscope-run"


def load(paths: list[Path], skip_bad: bool, progress: bool) -> tuple[Run, dict[int, Path]]:
    """The run named by ``paths`` and, where traces were read, their files by rank."""
    from syncscope.trace.load import load_traces, trace_files

    run_dirs = [p for p in paths if p.is_dir() and _is_run_dir(p)]
    if run_dirs and len(run_dirs) != len(paths):
        raise SyncscopeError("give either syncscope run directories or traces, not both")
    if run_dirs:
        from syncscope.analysis.build import load_run
        from syncscope.trace.combine import with_trace_overlap

        run = load_run(run_dirs)
        traced = [d / "traces" for d in run_dirs if (d / "traces").is_dir()]
        if traced:
            trace_run = load_traces(traced, skip_bad=skip_bad, progress=progress)
            run = with_trace_overlap(run, trace_run)
        return run, {}
    run = load_traces(paths, skip_bad=skip_bad, progress=progress)
    files: dict[int, Path] = {}
    for f in trace_files(paths):
        for r in run.ranks:
            if r.rank not in files and f"rank-{r.rank}" in f.name:
                files[r.rank] = f
    if len(files) != len(run.ranks):  # name files by the order they were read
        files = {r.rank: f for r, f in zip(run.ranks, trace_files(paths), strict=False)}
    return run, files


def findings_for(run: Run, hta: dict[str, Any] | None = None) -> list[Finding]:
    """syncscope's diagnoses plus the trace-only ones (a kind reported once)."""
    from syncscope.analysis.diagnose import diagnose
    from syncscope.trace.findings import trace_findings

    findings = diagnose(run)
    kinds = {f.kind for f in findings}
    findings.extend(f for f in trace_findings(run, hta) if f.kind not in kinds)
    order = {"error": 0, "warning": 1, "info": 2}
    findings.sort(key=lambda f: order[f.severity])
    return findings


def analyze(
    paths: Annotated[
        list[Path], typer.Argument(help="Run directories, trace directories or trace files.")
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="Report directory (default syncscope-out/analyze-<timestamp>)."
        ),
    ] = None,
    skip_bad: Annotated[
        bool,
        typer.Option(
            "--skip-bad",
            help="Leave out unreadable traces (listed in the report) instead of failing.",
        ),
    ] = False,
    hta: Annotated[
        bool,
        typer.Option(
            "--hta", help="Also run HTA's overlap and temporal breakdown (GPU traces; slow)."
        ),
    ] = False,
    fail_on: Annotated[
        str, typer.Option(help="Exit 1 on findings of this severity: never, warning, error.")
    ] = "error",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No terminal summary.")] = False,
) -> int:
    """Report on a saved run, or on torch.profiler (Kineto) traces of a training job."""
    from syncscope.render.outputs import exit_status, write_reports
    from syncscope.render.terminal import render_text

    if fail_on not in ("never", "warning", "error"):
        raise SyncscopeError(f"--fail-on must be one of never, warning, error, not {fail_on!r}")
    run, files = load(paths, skip_bad, progress=not quiet)
    extra = None
    if hta:
        from syncscope.trace.overlap import hta_overlap

        if not files:
            extra = {"error": "--hta needs trace files"}
        elif all(r.device == "cpu" for r in run.ranks):
            extra = {"error": "HTA's analyses need GPU kernels; these are CPU-only traces"}
        else:
            extra = hta_overlap(files)
    findings = findings_for(run, extra)
    out_dir = out or Path("syncscope-out") / f"analyze-{time.strftime('%Y%m%d-%H%M%S')}"
    written = write_reports(run, findings, out_dir)
    if not quiet:
        print(render_text(run, findings))
    print(
        f"syncscope: reports in {out_dir} ({', '.join(p.name for p in written)})", file=sys.stderr
    )
    return exit_status(findings, fail_on)


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze)
