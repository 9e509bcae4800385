"""Write every report file for a run, and turn findings into an exit status."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from syncscope.errors import SyncscopeError
from syncscope.model import Finding, Run
from syncscope.render.json_report import report_dict

FAIL_ON = ("never", "warning", "error")


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_reports(run: Run, findings: Sequence[Finding], out_dir: Path) -> list[Path]:
    """report.json and report.html in ``out_dir``; returns the paths written."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SyncscopeError(f"cannot write reports to {out_dir}: {exc.strerror}") from None
    written = []
    path = out_dir / "report.json"
    _atomic_write(path, json.dumps(report_dict(run, findings), indent=1, default=str) + "\n")
    written.append(path)
    try:
        from syncscope.render.html import render_html
    except ImportError:
        return written
    html_path = out_dir / "report.html"
    _atomic_write(html_path, render_html(run, list(findings)))
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
