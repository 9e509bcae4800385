"""``syncscope fix`` on a path that is not a plain script: one line that says what it is.

Was: a symlink loop, a symlink to a device and a FIFO all read "no such file"; a NUL byte
read "syntax error at line None"; ``--apply`` on a file with a second hard link left that
name on the old text."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from syncscope import cli
from tests.helpers.hostile import ROOT

EXAMPLE = ROOT / "examples" / "ddp_no_sync_backward_only.py"


def error_of(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli.main(["fix", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.removeprefix("syncscope: error: ").strip()


def test_what_the_path_is_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("one").symlink_to("two")
    Path("two").symlink_to("one")
    assert error_of(capsys, "one") == "one: a loop of symbolic links (no file at its end)"
    os.mkfifo("fifo.py")
    assert error_of(capsys, "fifo.py") == (
        "fifo.py: a FIFO, not a file syncscope fix reads; give the training script's file"
    )
    Path("dev.py").symlink_to("/dev/null")
    assert error_of(capsys, "dev.py") == (
        "dev.py: a symbolic link to /dev/null, a character device, not a file syncscope fix "
        "reads; give the training script's file"
    )
    Path("gone.py").symlink_to(tmp_path / "nowhere.py")
    assert error_of(capsys, "gone.py") == (
        f"gone.py: no such file (a symbolic link to {tmp_path}/nowhere.py, which does not exist)"
    )
    assert error_of(capsys, "absent.py") == "absent.py: no such file"


def test_a_nul_byte_names_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_bytes(b"import torch\nx = 1\0\n")
    assert error_of(capsys, str(script)) == (
        f"{script}: a NUL byte at line 2, column 6: not Python source; fix it before running "
        "syncscope fix"
    )


def test_apply_keeps_every_hard_link_on_the_fixed_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copy(EXAMPLE, "train.py")
    os.link("train.py", "linked.py")
    assert cli.main(["fix", "train.py", "--apply"]) == 0
    err = capsys.readouterr().err
    assert "train.py has 2 hard links: written in place, so every name sees the fix" in err
    fixed = Path("train.py").read_bytes()
    assert fixed != EXAMPLE.read_bytes()
    assert Path("linked.py").read_bytes() == fixed
    assert os.path.samefile("train.py", "linked.py")
    assert Path("train.py.bak").read_bytes() == EXAMPLE.read_bytes()
