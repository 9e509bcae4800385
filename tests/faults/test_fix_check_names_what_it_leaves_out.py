"""``fix --check`` says what it leaves out, and writes any file name to any terminal.

Walking a directory, ``fix --check`` leaves out build/, dist/, virtual environments and
symbolic links to folders: one line on stderr names them, and naming one checks it. A file
name the output's encoding cannot carry (``PYTHONIOENCODING=ascii``) is written with
escapes, never a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers.hostile import ROOT, tree_env

LOOP = ROOT / "examples" / "ddp_sync_every_step.py"  # SYN101 at line 17


def _check(cwd: Path, *paths: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "syncscope", "fix", "--check", *paths],
        cwd=cwd,
        env={**tree_env(), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_folders_left_out_are_named_and_checked_when_named(tmp_path: Path) -> None:
    for folder in ("src", "build", "dist", "env", "elsewhere", ".git"):
        (tmp_path / folder).mkdir()
        shutil.copy(LOOP, tmp_path / folder / "train.py")
    (tmp_path / "src" / "linked").symlink_to(tmp_path / "elsewhere")
    named = ("build", "dist", "env", f"src{os.sep}linked")
    done = _check(tmp_path, *named)
    # WHEN a folder is named, it is checked whatever its name, a link to one included
    assert done.returncode == 1, done.stderr
    assert sorted(line.split(":")[0] for line in done.stdout.splitlines()) == [
        f"{folder}{os.sep}train.py" for folder in named
    ]
    assert done.stderr == ""
    walked = _check(tmp_path, ".")
    assert walked.returncode == 1
    assert [line.split(":")[0] for line in walked.stdout.splitlines()] == [
        f"elsewhere{os.sep}train.py",  # once: not again through src/linked
        f"src{os.sep}train.py",
    ]
    # THEN one line names every folder left out (not the hidden ones) and how to check it
    (line,) = walked.stderr.splitlines()
    assert line.startswith("syncscope: not checked: "), line
    for left in ("build/", "dist/", "env/", f"src{os.sep}linked/"):
        assert left in line, line
    assert ".git" not in line and line.endswith("name a folder to check it")


def test_a_file_name_the_terminal_cannot_encode_is_escaped(tmp_path: Path) -> None:
    shutil.copy(LOOP, tmp_path / "entraîné.py")
    done = _check(tmp_path, "entraîné.py", "absent-é.py", PYTHONIOENCODING="ascii")
    assert done.returncode == 2, done.stderr  # a path missing: 2, the file still checked
    assert "Traceback" not in done.stderr
    assert done.stdout.startswith("entra\\xeen\\xe9.py:17: SYN101 "), done.stdout
    assert done.stderr == "syncscope: error: absent-\\xe9.py: no such file or directory\n"
