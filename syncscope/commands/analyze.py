"""``syncscope analyze PATH [PATH ...]``: report on saved runs or torch.profiler traces.

PATH is a syncscope run directory, a directory of Kineto traces, or trace files; several
directories (one per node) are merged into one job. Output as ``profile``: the terminal
summary, ``report.json`` and the report files.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from syncscope.errors import SyncscopeError

if TYPE_CHECKING:
    from syncscope.cli import Parser

__all__ = ["add_parser", "analyze"]

SUMMARY = "Report on a saved run, or on torch.profiler (Kineto) traces of a training job."


def analyze(
    paths: list[Path],
    out: Path | None = None,
    skip_bad: bool = False,
    hta: bool = False,
    fail_on: str = "error",
    quiet: bool = False,
) -> int:
    """Report on a saved run, or on torch.profiler (Kineto) traces of a training job."""
    from syncscope.analysis.inputs import findings_for, load
    from syncscope.render.outputs import exit_status, write_reports

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
        from syncscope.render.terminal import render_text  # rich: only when it prints

        print(render_text(run, findings))
    print(
        f"syncscope: reports in {out_dir} ({', '.join(p.name for p in written)})", file=sys.stderr
    )
    return exit_status(findings, fail_on)


def add_parser(subparsers: argparse._SubParsersAction[Parser]) -> None:
    parser = subparsers.add_parser("analyze", help=SUMMARY, description=SUMMARY, allow_abbrev=False)
    parser.add_argument(
        "paths",
        nargs="+",
        type=Path,
        metavar="PATH",
        help="Run directories, trace directories or trace files.",
    )
    parser.add_argument(
        "--out",
        "-o",
        type=Path,
        metavar="DIR",
        help="Report directory (default syncscope-out/analyze-<timestamp>).",
    )
    parser.add_argument(
        "--skip-bad",
        action="store_true",
        help="Leave out unreadable traces (listed in the report) instead of failing.",
    )
    parser.add_argument(
        "--hta",
        action="store_true",
        help="Also run HTA's overlap and temporal breakdown (GPU traces; slow).",
    )
    parser.add_argument(
        "--fail-on",
        default="error",
        metavar="LEVEL",
        help="Exit 1 on findings of this severity: never, warning, error. (default: %(default)s)",
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="No terminal summary.")
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    return analyze(
        args.paths,
        out=args.out,
        skip_bad=args.skip_bad,
        hta=args.hta,
        fail_on=args.fail_on,
        quiet=args.quiet,
    )
