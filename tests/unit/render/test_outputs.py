"""One way to finish a run: ``profile``'s end and ``analyze``'s share ``render.outputs.finish``."""

from __future__ import annotations

from pathlib import Path

import pytest

from syncscope.analysis.diagnose import diagnose
from syncscope.render.outputs import exit_status, finish
from syncscope.render.terminal import render_text
from tests.helpers import runs


@pytest.mark.parametrize("summary", ["terminal", "text"])
def test_finish_writes_the_reports_shows_the_summary_and_says_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], summary: str
) -> None:
    # GIVEN a run with a redundant sync (a warning)
    run = runs.redundant()
    findings = diagnose(run)
    assert exit_status(findings, "warning") == 1
    # WHEN finished, as profile ("terminal") or analyze ("text") finishes one
    code = finish(run, findings, tmp_path, "warning", False, summary=summary, where="reports in")
    out, err = capsys.readouterr()
    # THEN the report files, the summary on stdout, one line naming them, the exit status
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "report.json"]
    assert code == 1
    assert err == f"syncscope: reports in {tmp_path} (report.json, report.html)\n"
    assert "redundant-sync" in out
    if summary == "text":  # analyze prints the text of `report -f text`, one newline after it
        assert out == render_text(run, findings) + "\n"


def test_finish_quiet_prints_no_summary_and_fail_on_never_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = runs.redundant()
    code = finish(
        run, diagnose(run), tmp_path, "never", True, summary="terminal", where="run directory"
    )
    out, err = capsys.readouterr()
    assert (code, out) == (0, "")
    assert err.startswith(f"syncscope: run directory {tmp_path} (")
