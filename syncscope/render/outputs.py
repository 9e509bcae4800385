"""The output formats of a run, the report files written for it, and its exit status.

Every format is one module with a writer of one shape: the run model and its findings in,
one document out, ``write(run, findings, out: IO[bytes])``. ``FORMATS`` names the module
and function for each (imported only when that format is written), and the file it makes
in a run directory, if any: adding a format is adding a module and a line here.

Importing this module imports no renderer, so the command line lists the formats cheaply.
"""

from __future__ import annotations

import importlib
import io
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING, NamedTuple

from syncscope.atomic import atomic_write
from syncscope.errors import SyncscopeError

if TYPE_CHECKING:
    from syncscope.model import Finding, Run

    Writer = Callable[[Run, Sequence[Finding], IO[bytes]], None]

FAIL_ON = ("never", "warning", "error")


class Renderer(NamedTuple):  # not a dataclass: ``dataclasses`` costs the command line 7 ms
    module: str
    writer: str  # the function ``(run, findings, out: IO[bytes]) -> None`` in ``module``
    file: str | None = None  # its name in a run directory (None: not written there)


# in the order ``write_reports`` writes the files
FORMATS = {
    "json": Renderer("syncscope.render.json_report", "write_report_json", "report.json"),
    "html": Renderer("syncscope.render.html", "write_html", "report.html"),
    "text": Renderer("syncscope.render.terminal", "write_text"),
}


def writer(fmt: str) -> Writer:
    """The writer of format ``fmt`` (its module imported now)."""
    spec = FORMATS[fmt]
    function: Writer = getattr(importlib.import_module(spec.module), spec.writer)
    return function


def render(run: Run, findings: Sequence[Finding], fmt: str) -> str:
    """The whole document of format ``fmt``, as text."""
    buffer = io.BytesIO()
    writer(fmt)(run, findings, buffer)
    return buffer.getvalue().decode("utf-8")


def write_reports(run: Run, findings: Sequence[Finding], out_dir: Path) -> list[Path]:
    """Every format with a file name (report.json, report.html) in ``out_dir``; returns the
    paths written.

    Each is streamed to its file (rank by rank, the plotly bundle in pieces), so the reports
    of a large job cost little more memory than the run itself.
    """
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SyncscopeError(f"cannot write reports to {out_dir}: {exc.strerror}") from None
    written = []
    for fmt, spec in FORMATS.items():
        if spec.file is None:
            continue
        path = out_dir / spec.file
        atomic_write(path, partial(writer(fmt), run, findings))
        written.append(path)
    return written


def exit_status(findings: Sequence[Finding], fail_on: str) -> int:
    """1 when a finding at or above ``fail_on`` severity (one of ``FAIL_ON``) exists, else 0."""
    if fail_on == "never":
        return 0
    from syncscope.model import severity_rank  # the one severity order

    limit = severity_rank(fail_on)
    return 1 if any(severity_rank(f.severity) <= limit for f in findings) else 0


def finish(
    run: Run,
    findings: Sequence[Finding],
    out_dir: Path,
    fail_on: str,
    quiet: bool,
    *,
    summary: str,
    where: str,
) -> int:
    """The end of ``profile`` and ``analyze`` alike: write the reports into ``out_dir``, show
    the summary (unless ``quiet``), say where the reports are (``syncscope: WHERE OUT_DIR
    (report.json, report.html)`` on stderr); returns the exit status by ``fail_on``.

    ``summary``: ``terminal`` (profile) prints for the terminal, in colour there and 120
    columns wide when piped; ``text`` (analyze) prints the plain text of ``report -f text``
    (no colour, 110 columns). The two commands have always printed so: kept apart on purpose,
    so that neither one's output changes. A report that cannot be written (a full disk) is
    the ``SyncscopeError`` of ``write_reports``, raised before anything is shown."""
    written = write_reports(run, findings, out_dir)
    if not quiet:
        show_summary(run, findings, summary)
    from syncscope.text import visible

    names = ", ".join(p.name for p in written)
    print(visible(f"syncscope: {where} {out_dir} ({names})"), file=sys.stderr)
    return exit_status(findings, fail_on)


def show_summary(run: Run, findings: Sequence[Finding], summary: str) -> None:
    """The terminal summary in ``finish``'s style ``summary`` (``terminal`` or ``text``)."""
    from syncscope.render import terminal  # rich: only when it prints

    if summary == "terminal":
        terminal.print_summary(run, findings)
    else:
        print(terminal.render_text(run, findings))
