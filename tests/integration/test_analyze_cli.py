"""``syncscope analyze`` end to end: in-process through main(), and once as a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from syncscope.cli import main

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces"


def _copy(tmp_path: Path, name: str) -> Path:
    dest = tmp_path / name
    shutil.copytree(SAMPLES / name, dest)
    return dest


def test_redundant_syncs_from_gloo_traces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = _copy(tmp_path, "syncscope-gloo-ddp-every")
    out = tmp_path / "report"
    status = main(["analyze", str(traces), "--out", str(out), "--fail-on", "never"])
    assert status == 0
    report = json.loads((out / "report.json").read_text())
    kinds = {f["kind"] for f in report["findings"]}
    assert "redundant-sync" in kinds and "exposed-communication" in kinds
    assert report["source"] == "trace"
    assert "redundant-sync" in capsys.readouterr().out


def test_correct_loop_is_clean_of_sync_findings(tmp_path: Path) -> None:
    traces = _copy(tmp_path, "syncscope-gloo-ddp-no_sync")
    out = tmp_path / "report"
    status = main(["analyze", str(traces), "--out", str(out), "--quiet"])
    report = json.loads((out / "report.json").read_text())
    kinds = {f["kind"] for f in report["findings"]}
    assert not kinds & {"redundant-sync", "missing-sync", "collective-mismatch"}
    assert status == 0


def test_bad_trace_is_one_line_and_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = _copy(tmp_path, "syncscope-gloo-ddp-no_sync")
    (traces / "rank-1.json.gz").write_bytes(b"\x1f\x8b\x08\x00" + b"\x01" * 64)
    status = main(["analyze", str(traces), "--out", str(tmp_path / "r"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "rank-1.json.gz" in err[0]
    status = main(["analyze", str(traces), "--out", str(tmp_path / "r"), "--quiet", "--skip-bad"])
    assert status == 0
    notes = json.dumps(json.loads((tmp_path / "r" / "report.json").read_text()))
    assert "skipped" in notes and "rank-1.json.gz" in notes


def test_subprocess(tmp_path: Path) -> None:
    traces = _copy(tmp_path, "nccl_parser_config")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "syncscope", "analyze", str(traces), "--out", str(tmp_path / "r")],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr
    assert "Traceback" not in proc.stderr
    assert (tmp_path / "r" / "report.json").is_file()
