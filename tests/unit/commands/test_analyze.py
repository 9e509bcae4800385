"""`analyze` never reuses an output folder: analyses started in the same second get their own."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from syncscope.atomic import new_folder
from syncscope.commands import analyze

SAMPLE = Path(__file__).resolve().parents[3] / "sample_traces" / "syncscope-gloo-ddp-no_sync"


def test_concurrent_new_folders_are_distinct(tmp_path: Path) -> None:
    # GIVEN: 8 threads asking for the same folder name at once
    base = tmp_path / "out" / "analyze-20260101-000000"
    made: list[Path] = []
    threads = [threading.Thread(target=lambda: made.append(new_folder(base))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # THEN: each got its own, the first the plain name
    assert len(set(made)) == 8 and base in made
    assert {p.name for p in made} == {base.name, *(f"{base.name}-{n}" for n in range(2, 9))}


def test_two_analyses_in_the_same_second_write_two_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN: the clock frozen on one second, and a trace
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(analyze.time, "strftime", lambda fmt: "20260101-000000")
    trace = tmp_path / "t"
    shutil.copytree(SAMPLE, trace)
    # WHEN: analyzed twice
    for _ in range(2):
        analyze.analyze([trace], quiet=True)
    # THEN: two folders, each with its own report
    folders = sorted((tmp_path / "syncscope-out").iterdir())
    assert [f.name for f in folders] == ["analyze-20260101-000000", "analyze-20260101-000000-2"]
    assert all((f / "report.json").is_file() for f in folders)
