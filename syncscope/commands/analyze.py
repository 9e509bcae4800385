"""``syncscope analyze PATH [PATH ...]``: report on saved runs or torch.profiler traces.

PATH is a syncscope run directory, a directory of Kineto traces, or trace files; several
directories (one per node) are merged into one job. Output as ``profile``: the terminal
summary, ``report.json`` and the report files, through the same ending
(``syncscope.render.outputs.finish``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from syncscope.render.outputs import FAIL_ON

if TYPE_CHECKING:
    from syncscope.analysis.flight import FlightResult
    from syncscope.cli import Parser

__all__ = ["add_parser", "analyze", "run"]

SUMMARY = (
    "Report on a saved run, on torch.profiler (Kineto) traces of a training job, or on "
    "torch Flight Recorder dumps."
)


def add_parser(subparsers: argparse._SubParsersAction[Parser]) -> None:
    parser = subparsers.add_parser("analyze", help=SUMMARY, description=SUMMARY, allow_abbrev=False)
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="Run directories, trace directories or trace files, torch Flight Recorder dumps "
        "(files or their directory); with --scheduler also "
        "fsspec URLs (s3://, gs://, file://) of trace files or directories.",
    )
    parser.add_argument(
        "--out",
        "-o",
        type=Path,
        metavar="DIR",
        help="Report directory (default syncscope-out/analyze-<timestamp>, with -2, -3... when taken).",
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
        choices=FAIL_ON,
        metavar="LEVEL",
        help="Exit 1 on findings of this severity: %(choices)s. (default: %(default)s)",
    )
    parser.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="Read the trace files on a Dask distributed cluster: its scheduler's address "
        "(tcp://host:8786), a scheduler file (dask scheduler --scheduler-file), or 'local' "
        "for a cluster on this machine. Needs syncscope[dask]. (default: built-in workers)",
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="No terminal summary.")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from syncscope.load.trace.read import collector_paused

    paths = [p if "://" in p else Path(p) for p in args.paths]
    with collector_paused():  # (millions of objects made, none in a cycle: see read.py)
        return analyze(
            paths, args.out, args.skip_bad, args.hta, args.fail_on, args.quiet, args.scheduler
        )


def analyze(
    paths: Sequence[Path | str],
    out: Path | None = None,
    skip_bad: bool = False,
    hta: bool = False,
    fail_on: str = "error",
    quiet: bool = False,
    scheduler: str | None = None,
) -> int:
    """Report on saved runs or torch.profiler (Kineto) traces: report files in ``out``, the
    summary on stdout; the exit status by ``fail_on``. ``scheduler``: read the traces on
    that Dask cluster (``local``, an address or a scheduler file; paths may be URLs)."""
    from syncscope.analysis.findings import findings_for
    from syncscope.atomic import new_folder
    from syncscope.load.inputs import load, split_dumps
    from syncscope.render.outputs import finish
    from syncscope.text import visible

    rest, dumps = split_dumps(paths)
    flight = _flight(dumps, paths, skip_bad)
    if rest or flight is None:
        run, files = load(rest, skip_bad, progress=not quiet, scheduler=scheduler)
    else:
        run, files = flight.run, {}
    extra = None
    if hta:
        from syncscope.load.trace.overlap import hta_overlap

        if not files:
            extra = {"error": "--hta needs trace files"}
        elif all(r.device == "cpu" for r in run.ranks):
            extra = {"error": "HTA's analyses need GPU kernels; these are CPU-only traces"}
        else:
            extra = hta_overlap(files)
        if isinstance(extra, dict) and isinstance(extra.get("error"), str):
            print(
                visible(f"syncscope: warning: --hta not applied: {extra['error']}"), file=sys.stderr
            )
    findings = findings_for(run, extra) if rest or flight is None else []
    if flight is not None:
        from syncscope.analysis.flight import merge_findings, with_dump_notes
        from syncscope.model import severity_rank

        live = bool(rest) and run.meta.source == "live"
        if rest:
            run = with_dump_notes(run, flight)
        findings = merge_findings(findings, flight, live=live)
        findings.sort(key=lambda f: severity_rank(f.severity))
    if run.meta.source == "live":  # a run directory: what fix does about it, as profile shows
        from syncscope.fixes.proposals import with_fix_proposals

        one = rest[0] if len(rest) == 1 and isinstance(rest[0], Path) else None
        findings = with_fix_proposals(run, findings, one)
    out_dir = out or new_folder(Path("syncscope-out") / f"analyze-{time.strftime('%Y%m%d-%H%M%S')}")
    return finish(run, findings, out_dir, fail_on, quiet, summary="text", where="reports in")


def _flight(
    dumps: Sequence[Path], paths: Sequence[Path | str], skip_bad: bool
) -> FlightResult | None:
    """What the torch Flight Recorder dumps among the inputs say (None: there are none).
    ``skip_bad``: unreadable dumps are left out, named in the notes, and their ranks missing."""
    if not dumps:
        return None
    from syncscope.analysis.flight import analyze_dumps
    from syncscope.errors import SyncscopeError
    from syncscope.load.flight import read_dumps

    skipped: list[str] = []
    skipped_ranks: list[int] = []
    read = read_dumps(dumps, skipped if skip_bad else None, skipped_ranks)
    if not read:
        raise SyncscopeError(f"no readable Flight Recorder dump ({'; '.join(skipped)})")
    result = analyze_dumps(read, " ".join(str(p) for p in paths), skipped_ranks)
    notes = tuple(f"skipped (--skip-bad): {s}" for s in skipped)
    if notes:
        import dataclasses

        meta = dataclasses.replace(result.run.meta, notes=(*result.run.meta.notes, *notes))
        run = dataclasses.replace(result.run, meta=meta)
        result = dataclasses.replace(result, run=run, notes=(*result.notes, *notes))
    return result
