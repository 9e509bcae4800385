"""A run directory holding only a report.json, as ``syncscope fix --from RUN`` reads it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def report_run_dir(
    tmp_path: Path, script: Path, findings: list[dict[str, object]], sha: str = ""
) -> Path:
    """``tmp_path/run`` with a report of ``findings`` about ``script`` (its sha256 unless
    ``sha`` is given)."""
    run = tmp_path / "run"
    run.mkdir()
    digest = sha or hashlib.sha256(script.read_bytes()).hexdigest()
    report = {
        "schema_version": 1,
        "script": {"path": str(script), "sha256": digest},
        "findings": findings,
    }
    (run / "report.json").write_text(json.dumps(report))
    return run
