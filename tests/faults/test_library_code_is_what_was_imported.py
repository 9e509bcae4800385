"""Library code is decided by what was imported, not by a substring of its path:
DeepSpeed imported from a ``PYTHONPATH`` outside site-packages was the user's own
code, so its reductions were the user's and ZeRO-1 read as a missing sync ([0, 0, 0]); a
user's project under a directory whose name holds "site-packages" was library code."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from syncscope.capture import sites


@pytest.fixture
def layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``--target``-style tree on sys.path holding an installed distribution's top-level
    package (rich, a core dependency: installed wherever syncscope is), and the user's
    script directory beside it."""
    target = tmp_path / "target"
    (target / "rich").mkdir(parents=True)
    project = tmp_path / "site-packages-study" / "proj"
    project.mkdir(parents=True)
    monkeypatch.syspath_prepend(str(target))
    monkeypatch.setattr(sites, "_script_dir", lambda: str(project), raising=False)
    return tmp_path


def _is_users(path: str) -> bool:
    """What the capture decides for a frame of ``path`` (a code object compiled there; its
    source names the path: code objects compare equal regardless of their file)."""
    return bool(sites._user_file(compile(f"x = {path!r}", path, "exec")))


def test_an_installed_package_on_pythonpath_is_library(layout: Path) -> None:
    path = str(layout / "target" / "rich" / "console.py")
    assert not _is_users(path)


def test_a_project_under_a_site_packages_named_directory_is_the_users(layout: Path) -> None:
    # the script directory's name holds "site-packages" but is no package directory
    path = str(layout / "site-packages-study" / "proj" / "train.py")
    assert _is_users(path)
    # nor a helper module beside it named like nothing installed
    other = str(layout / "site-packages-study" / "proj" / "helpers" / "sync.py")
    assert _is_users(other)


def test_a_module_not_installed_on_pythonpath_is_the_users(layout: Path) -> None:
    (layout / "target" / "my_trainer").mkdir()
    assert _is_users(str(layout / "target" / "my_trainer" / "loop.py"))


def test_real_package_directories_stay_library(layout: Path) -> None:
    assert not _is_users(os.sep + os.path.join("opt", "venv", "site-packages", "x.py"))
    assert not _is_users(os.path.abspath(sites.__file__))
