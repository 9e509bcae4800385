"""Odd inputs end in one line and exit 2, or in a complete run: never a traceback, never a
run syncscope cannot read back.

The cases: a ``meta.json`` or ``report.json``
nested 100k deep, a script file name that is not UTF-8, a ``--hang-timeout`` the option
check took and the run directory's reader refused, a report written onto a full device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from syncscope import cli
from syncscope.errors import SyncscopeError
from syncscope.fields import SANE_MAX, field_float
from tests.helpers import hostile as h

DEEP = b"[" * 100_000


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def test_a_meta_json_nested_100k_deep_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: RecursionError traceback (the stdlib's JSON parser recurses per level)."""
    run = h.broken_meta(tmp_path, DEEP)
    for command in (["report", str(run), "-f", "text"], ["analyze", str(run)]):
        assert cli.main(command) == 2
        assert one_line(capsys) == (
            f"syncscope: error: {run}/meta.json: not a syncscope run (JSON nested too deeply)"
        )


def test_a_report_json_nested_100k_deep_is_one_line_for_fix_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = h.write_run(tmp_path)
    (run / "report.json").write_bytes(DEEP)
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    assert cli.main(["fix", str(script), "--from", str(run)]) == 2
    assert one_line(capsys) == (
        f"syncscope: error: {run}/report.json: not a syncscope report (JSON nested too deeply)"
    )


@pytest.mark.parametrize("command", ["diff", "report"])
def test_a_report_onto_a_full_device_is_one_line(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``diff --html /dev/full`` was an OSError traceback (``report -o`` handled it)."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    a, b = h.write_run(tmp_path, "a"), h.write_run(tmp_path, "b")
    argv = ["diff", "--html", "/dev/full", str(a), str(b)]
    if command == "report":
        argv = ["report", str(a), "-o", "/dev/full"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.endswith("syncscope: error: cannot write /dev/full: No space left on device\n")
    assert err.count("syncscope: error") == 1 and "Traceback" not in err


def test_the_hang_timeout_s_bound_is_the_readers() -> None:
    """profile takes exactly what meta.json's reader takes (the option check is in
    tests/faults/test_profile_never_harms_the_job.py: 1e308 and 1.1e18 are refused before any
    rank)."""
    assert field_float({"hang_timeout_s": SANE_MAX}, "hang_timeout_s", "meta.json") == SANE_MAX
    with pytest.raises(SyncscopeError, match="finite number of sane size"):
        field_float({"hang_timeout_s": SANE_MAX * 1.1}, "hang_timeout_s", "meta.json")


@pytest.mark.slow
def test_a_script_whose_file_name_is_not_utf8_runs_and_is_reported(tmp_path: Path) -> None:
    """A Latin-1 file name (byte 0xff): was, every rank crashed writing its header (orjson
    refuses the surrogate Python decodes it to), the script never ran, and ``profile``
    printed a traceback and no report. Now the name is written as ``\\xff``."""
    source = (h.ROOT / "tests" / "scripts" / "buckets.py").read_bytes()
    script = os.fsdecode(bytes(tmp_path) + b"/caf\xff.py")
    Path(script).write_bytes(source)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "syncscope", "profile", "-q", "--nproc-per-node", "2"]
    proc = subprocess.run(
        [*command, "--out", str(out), script],
        env=h.tree_env(),
        capture_output=True,
        timeout=240,
    )
    stderr = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, stderr
    assert b"Traceback" not in proc.stderr
    meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
    assert meta["script"] == f"{tmp_path}/caf\\xff.py"
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["grad_syncs_per_window"]
    for rank in (0, 1):
        lines = (out / "ranks" / f"rank-{rank:05d}.jsonl").read_text(encoding="utf-8")
        header = json.loads(lines.splitlines()[0])
        assert header["target"].endswith("caf\\xff.py")
    again = subprocess.run(
        [sys.executable, "-m", "syncscope", "report", str(out), "-f", "text"],
        env=h.tree_env(),
        capture_output=True,
        timeout=120,
    )
    assert again.returncode == 0 and b"caf\\xff.py" in again.stdout


@pytest.mark.slow
def test_trace_windows_past_the_job_s_end_say_so(tmp_path: Path) -> None:
    """``--trace-windows 100:200`` on a 3-window job: was no trace and not a word."""
    source = (h.ROOT / "tests" / "scripts" / "buckets.py").read_text()
    proc, out = h.profile_script(
        tmp_path, "train.py", source, "--trace", "--trace-windows", "100:200"
    )
    assert proc.returncode == 0, proc.stderr
    said = (
        "--trace: no trace: --trace-windows 100:200, and the job ended before window 100 "
        "(window 2 was its last); the counting report is complete"
    )
    assert proc.stderr.count(said) == 1, proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert any("the job ended before window 100" in note for note in report["notes"])
    assert report["grad_syncs_per_window"]


def test_report_of_a_run_still_being_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: ``report RUN`` wrote report.html into a running job's directory (which the job
    then overwrote) and said nothing of it running."""
    run = h.write_run(tmp_path)
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (run / ".syncscope-profile.lock").write_text(str(writer.pid))
        assert cli.main(["report", str(run)]) == 2
        assert one_line(capsys) == (
            f"syncscope: error: {run}: syncscope profile (pid {writer.pid}) is still running "
            "there and writes its report.html when the job ends; for what is on disk now: "
            f"syncscope report {run} -f text, or -o FILE"
        )
        assert not (run / "report.html").exists()
        assert cli.main(["report", str(run), "-f", "text"]) == 0
        err = capsys.readouterr().err
        assert err.startswith(
            f"syncscope: warning: {run}: syncscope profile (pid {writer.pid}) is still running"
        )
    finally:
        writer.kill()
        writer.wait()
    assert cli.main(["report", str(run)]) == 0  # its profile gone: a report like any other
    assert (run / "report.html").exists()
