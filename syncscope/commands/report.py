"""``syncscope report RUN_DIR``: render a saved run again, as HTML, JSON or text.

The run is read and diagnosed exactly as ``syncscope analyze`` reads it (trace overlap and
trace-only findings included), so a re-rendered page matches the one written at the time.
It must read the run, not report.json: the page's timeline and the text summary draw each
window's collectives, which report.json does not hold, and a newer syncscope's diagnoses
apply to an old run (docs/report.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from syncscope.render.outputs import FORMATS

if TYPE_CHECKING:
    from syncscope.cli import Parser

SUMMARY = "Render a saved run again: the HTML page, the JSON report or the terminal text."


def add_parser(subparsers: argparse._SubParsersAction[Parser]) -> None:
    parser = subparsers.add_parser("report", help=SUMMARY, description=SUMMARY, allow_abbrev=False)
    parser.add_argument(
        "run_dir", type=Path, metavar="RUN_DIR", help="A run directory written by syncscope."
    )
    parser.add_argument(
        "--format",
        "-f",
        dest="fmt",
        choices=sorted(FORMATS),
        default="html",
        help="%(choices)s. (default: %(default)s)",
    )
    parser.add_argument(
        "--output",
        "-o",
        metavar="FILE",
        help="File to write, '-' for stdout. Default: RUN_DIR/report.html for html, "
        "stdout for json and text.",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from syncscope.load.trace.read import collector_paused

    with collector_paused():  # (a run of thousands of ranks: see analyze)
        report(args.run_dir, args.fmt, args.output)


def report(run_dir: Path, fmt: str = "html", output: str | None = None) -> None:
    """Render a saved run again in format ``fmt`` (render/outputs.py's ``FORMATS``) to
    ``output``: a file, or ``-`` for stdout; by default RUN_DIR/report.html for html and
    stdout for the others."""
    from syncscope.commands.saved import load_and_diagnose
    from syncscope.errors import SyncscopeError
    from syncscope.render.outputs import render, writer
    from syncscope.text import visible

    _check_not_running(run_dir, fmt, output)
    run, findings = load_and_diagnose(run_dir)
    if output is None and fmt == "html":
        output = str(run_dir / "report.html")
    if output is None or output == "-":
        sys.stdout.write(render(run, findings, fmt))
        return
    from functools import partial

    from syncscope.atomic import write_output

    try:
        write_output(Path(output), partial(writer(fmt), run, findings))
    except OSError as exc:
        raise SyncscopeError(f"{output}: cannot write it ({exc.strerror or exc})") from None
    print(visible(f"syncscope: wrote {output}"), file=sys.stderr)


def _check_not_running(run_dir: Path, fmt: str, output: str | None) -> None:
    """A run whose ``syncscope profile`` still runs: its own report.html is written when the
    job ends, so none is written there now; another output is made with a warning that it
    covers what is on disk so far."""
    from syncscope.errors import SyncscopeError
    from syncscope.rundir import running_profile

    pid = running_profile(run_dir)
    if pid is None:
        return
    if output is None and fmt == "html":
        raise SyncscopeError(
            f"{run_dir}: syncscope profile (pid {pid}) is still running there and writes its "
            "report.html when the job ends; for what is on disk now: "
            f"syncscope report {run_dir} -f text, or -o FILE"
        )
    from syncscope.text import visible

    print(
        visible(
            f"syncscope: warning: {run_dir}: syncscope profile (pid {pid}) is still running: "
            "this covers what is on disk so far (ranks without an exit record may still be "
            "running)"
        ),
        file=sys.stderr,
    )
