"""``syncscope report RUN_DIR``: render a saved run again, as HTML, JSON or text.

The run is read and diagnosed exactly as ``syncscope analyze`` reads it (trace overlap and
trace-only findings included), so a re-rendered page matches the one written at the time.
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from syncscope.errors import BadRunDirectory, SyncscopeError

if TYPE_CHECKING:
    from syncscope.cli import Parser
    from syncscope.model import Finding, Run

SUMMARY = "Render a saved run again: the HTML page, the JSON report or the terminal text."


class Format(str, Enum):
    html = "html"
    json = "json"
    text = "text"


def render_report(run: Run, findings: Sequence[Finding], fmt: Format) -> str:
    if fmt is Format.html:
        from syncscope.render.html import render_html

        return render_html(run, findings)
    if fmt is Format.json:
        from syncscope.render.json_report import write_report_json

        buffer = io.BytesIO()  # byte for byte what render.outputs writes as report.json
        write_report_json(run, findings, buffer)
        return buffer.getvalue().decode("utf-8")
    from syncscope.render.terminal import render_text

    return render_text(run, findings)


def write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise SyncscopeError(f"cannot write {path}: {exc.strerror or exc}") from None


def load_and_diagnose(run_dir: Path) -> tuple[Run, list[Finding]]:
    """Read a saved run and diagnose it: the one path every re-rendering command takes."""
    if not run_dir.exists():
        raise BadRunDirectory(f"{run_dir}: no such run directory")
    from syncscope.analysis.inputs import findings_for, load

    run, _files = load([run_dir], skip_bad=False, progress=False)
    return run, findings_for(run)


def report(run_dir: Path, fmt: Format = Format.html, output: str | None = None) -> None:
    """Render a saved run again: the HTML page, the JSON report or the terminal text."""
    run, findings = load_and_diagnose(run_dir)
    text = render_report(run, findings, fmt)
    if output is None and fmt is Format.html:
        output = str(run_dir / "report.html")
    if output is None or output == "-":
        sys.stdout.write(text)
        return
    write_text(Path(output), text)
    print(f"syncscope: wrote {output}", file=sys.stderr)


def add_parser(subparsers: argparse._SubParsersAction[Parser]) -> None:
    parser = subparsers.add_parser("report", help=SUMMARY, description=SUMMARY, allow_abbrev=False)
    parser.add_argument(
        "run_dir", type=Path, metavar="RUN_DIR", help="A run directory written by syncscope."
    )
    parser.add_argument(
        "--format",
        "-f",
        dest="fmt",
        choices=[f.value for f in Format],
        default=Format.html.value,
        help="html, json or text. (default: %(default)s)",
    )
    parser.add_argument(
        "--output",
        "-o",
        metavar="FILE",
        help="File to write, '-' for stdout. Default: RUN_DIR/report.html for html, "
        "stdout for json and text.",
    )
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> None:
    report(args.run_dir, Format(args.fmt), args.output)
