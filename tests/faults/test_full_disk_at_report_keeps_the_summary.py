"""A full disk when ``profile`` writes its reports: the summary is printed, then the error in one
line, and the job's own failure status is kept."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import IO, Any

import pytest

from syncscope.launch.job import report_run
from tests.helpers.hostile import write_run

# --- a full disk when profile writes its reports ---------------------------------------------


def _disk_full(*_: Any) -> Any:
    def write(_run: Any, _findings: Any, out: IO[bytes]) -> None:
        out.write(b"{")
        raise OSError(errno.ENOSPC, "No space left on device")

    return write


@pytest.mark.parametrize("quiet", [False, True])
def test_full_disk_at_report_prints_the_summary_then_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], quiet: bool
) -> None:
    run_dir = write_run(tmp_path)
    monkeypatch.setattr("syncscope.render.outputs.writer", _disk_full)
    status = report_run(run_dir, 0, None, "error", quiet)
    out, err = capsys.readouterr()
    assert status == 2
    assert "world size 2" in out and "verdict: clean" in out  # the summary, even with -q
    last = err.strip().splitlines()[-1]
    assert last.startswith("syncscope: error: cannot write ")
    assert "No space left on device" in last
    assert "2 window(s) on 2 rank(s)" in last
    assert f"syncscope report {run_dir}" in last
    assert "Traceback" not in err
    assert sorted(p.name for p in run_dir.iterdir()) == ["meta.json", "ranks"]  # no half file


def test_full_disk_keeps_the_jobs_own_failure_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = write_run(tmp_path)
    monkeypatch.setattr("syncscope.render.outputs.writer", _disk_full)
    assert report_run(run_dir, 7, 1, "error", True) == 7
    assert "No space left on device" in capsys.readouterr().err
