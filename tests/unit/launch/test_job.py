"""A failed run tells one story: the first rank to fail is the same in stderr, the terminal
card and report.json, whatever rank the launcher names (torchrun's first failure ties at
one-second resolution and then names the lowest rank)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from syncscope.launch.job import report_run
from tests.helpers.hostile import run_events, write_run


def _both_failed(rank: int) -> list[dict[str, Any]]:
    """Rank 1 raises first; rank 0 fails a second later (its peer is gone)."""
    events = run_events(rank)
    exit_event = events[-1]
    exit_event["status"] = 1
    if rank == 1:
        exit_event["reason"] = "RuntimeError: boom"
    else:
        exit_event["reason"] = "RuntimeError: Connection closed by peer"
        exit_event["t"] += 10**9
    return events


def test_stderr_names_the_rank_the_finding_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "300")  # the card's message on one line
    # GIVEN both ranks failed, rank 1 first, and the launcher reporting rank 0
    run_dir = write_run(tmp_path, events=_both_failed)
    # WHEN the run is reported
    status = report_run(run_dir, 1, 0, "error", quiet=False)
    out, err = capsys.readouterr()
    # THEN report.json, the terminal card and stderr all name rank 1 first
    assert status == 1
    report = json.loads((run_dir / "report.json").read_text())
    failed = next(f for f in report["findings"] if f["kind"] == "run-failed")
    assert failed["evidence"]["first_failed_rank"] == 1
    assert "rank 1 first" in out
    assert "the script failed on rank 1 first, with exit status 1" in err
    assert "rank(s) 0 failed after it" in err
    assert "failed on rank 0" not in err


def test_one_failed_rank_and_the_rest_stopped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def events(rank: int) -> list[dict[str, Any]]:
        evs = run_events(rank)
        if rank == 1:
            evs[-1].update(status=1, reason="RuntimeError: boom")
        else:
            evs[-1].update(status=143, reason="killed by signal 15 (SIGTERM)")
        return evs

    run_dir = write_run(tmp_path, events=events)
    report_run(run_dir, 1, 1, "error", quiet=True)
    err = capsys.readouterr().err
    assert (
        "the script failed on rank 1 first, with exit status 1 (its output is above); "
        "the other ranks were stopped by the launcher"
    ) in err
