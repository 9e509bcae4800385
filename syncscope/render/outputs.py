"""Write every report file for a run, and turn findings into an exit status."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from syncscope.errors import SyncscopeError
from syncscope.model import Finding, Run
from syncscope.render.json_report import write_report_json

FAIL_ON = ("never", "warning", "error")


def _atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """``write`` into a temporary file beside ``path``, then rename it over ``path``."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("wb") as out:
            write(out)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise SyncscopeError(f"cannot write {path}: {exc.strerror or exc}") from None


def write_reports(run: Run, findings: Sequence[Finding], out_dir: Path) -> list[Path]:
    """report.json and report.html in ``out_dir``; returns the paths written.

    Both are streamed to their files (rank by rank, the plotly bundle in pieces), so the
    reports of a large job cost little more memory than the run itself.
    """
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SyncscopeError(f"cannot write reports to {out_dir}: {exc.strerror}") from None
    written = []
    path = out_dir / "report.json"
    _atomic_write(path, lambda out: write_report_json(run, findings, out))
    written.append(path)
    try:
        from syncscope.render.html import write_html
    except ImportError:
        return written
    html_path = out_dir / "report.html"
    _atomic_write(html_path, lambda out: write_html(run, list(findings), out))
    written.append(html_path)
    return written


def exit_status(findings: Sequence[Finding], fail_on: str) -> int:
    """1 when a finding at or above ``fail_on`` severity exists, else 0."""
    if fail_on not in FAIL_ON:
        raise SyncscopeError(f"--fail-on must be one of {', '.join(FAIL_ON)}, not {fail_on!r}")
    if fail_on == "never":
        return 0
    levels = {"warning": ("warning", "error"), "error": ("error",)}[fail_on]
    return 1 if any(f.severity in levels for f in findings) else 0
