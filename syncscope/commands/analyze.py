"""``syncscope analyze PATH [PATH ...]``: report on saved runs or torch.profiler traces.

PATH is a syncscope run directory, a directory of Kineto traces, or trace files; several
directories (one per node) are merged into one job. Output as ``profile``: the terminal
summary, ``report.json`` and the report files.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from syncscope.analysis.sources import findings_for, load
from syncscope.errors import SyncscopeError

__all__ = ["analyze", "findings_for", "load", "register"]


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
