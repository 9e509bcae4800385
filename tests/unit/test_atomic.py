"""syncscope/atomic.py: every file syncscope writes is written whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

import pytest

from syncscope import cli
from syncscope.atomic import atomic_write, copy_fresh
from syncscope.commands import saved
from syncscope.errors import SyncscopeError
from tests.helpers import runs


def test_a_failure_mid_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    target.write_text("the old page")

    def half_then_full_disk(out: IO[bytes]) -> None:
        out.write(b"<!doctype html> half a pa")
        raise OSError(28, "No space left on device")

    with pytest.raises(SyncscopeError, match=r"cannot write .*report.html: No space left"):
        atomic_write(target, half_then_full_disk)
    assert target.read_text() == "the old page"
    assert os.listdir(tmp_path) == ["report.html"]


def test_an_interrupt_mid_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "meta.json"
    target.write_text("{}")

    def interrupted(out: IO[bytes]) -> None:
        out.write(b'{"format": ')
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, interrupted)
    assert target.read_text() == "{}" and os.listdir(tmp_path) == ["meta.json"]


def test_writes_through_a_symlink_and_keeps_the_mode(tmp_path: Path) -> None:
    real = tmp_path / "train.py"
    real.write_text("old\n")
    real.chmod(0o750)
    link = tmp_path / "link.py"
    link.symlink_to(real)
    atomic_write(link, b"new\n", durable=True)
    assert link.is_symlink() and real.read_text() == "new\n"
    assert real.stat().st_mode & 0o777 == 0o750
    assert sorted(os.listdir(tmp_path)) == ["link.py", "train.py"]


def test_copy_fresh_never_replaces_a_file(tmp_path: Path) -> None:
    source = tmp_path / "s.py"
    source.write_text("x = 1\n")
    (tmp_path / "s.py.bak").write_text("the user's\n")
    assert copy_fresh(source, tmp_path / "s.py.bak") == tmp_path / "s.py.bak.1"
    assert (tmp_path / "s.py.bak").read_text() == "the user's\n"
    assert (tmp_path / "s.py.bak.1").read_text() == "x = 1\n"


def test_report_output_is_written_atomically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a page written before, and a render that fails half way (a full disk, a bug)
    monkeypatch.setattr(saved, "load_and_diagnose", lambda path: (runs.redundant(), []))
    page = tmp_path / "page.html"
    page.write_text("the page written before")

    def failing(run: object, findings: object, out: IO[bytes]) -> None:
        out.write(b"<!doctype html>")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("syncscope.render.html.write_html", failing)
    # WHEN syncscope report writes over it, THEN one line, and the old page is intact
    assert cli.main(["report", str(tmp_path), "-o", str(page)]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert page.read_text() == "the page written before"
    assert sorted(os.listdir(tmp_path)) == ["page.html"]
