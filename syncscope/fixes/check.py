"""``syncscope fix --check PATH...``: the loops ``fix`` would rewrite, for CI and pre-commit.

Reads the code only (nothing is run, imported or written): every ``.py`` file given, and
under every directory given (hidden folders, ``__pycache__``, virtual environments,
``site-packages``, ``node_modules``, ``build``, ``dist`` and symbolic links to folders left
out, and the ones not hidden named in one line on stderr; a folder named on the command
line is checked whatever its name). One line per problem on stdout,
``file:line: SYNxxx message``, as ``fix`` prints them; exit status 1 if any, 0 if none,
2 if a path is missing or a file cannot be read or parsed (one line each, the other files
still checked). A name the terminal's encoding cannot show is written with escapes.

A file whose text never says ``backward`` holds no accumulation loop the rules know, so it
is not parsed at all: most of a code base costs one read.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

from syncscope.errors import SyncscopeError

__all__ = ["check_paths", "python_files", "skipped_line"]

SKIPPED_DIRS = frozenset(
    {"__pycache__", "site-packages", "node_modules", "venv", "env", "build", "dist"}
)


def _left_out(root: str, name: str) -> str:
    """Why the folder ``name`` under ``root`` is not walked ("" when it is)."""
    folder = Path(root, name)
    if folder.is_symlink():
        return "a symbolic link"
    if name in SKIPPED_DIRS:
        return "by its name"
    if (folder / "pyvenv.cfg").exists():
        return "a virtual environment"
    return ""


def python_files(path: Path, skipped: list[Path] | None = None) -> Iterator[Path]:
    """``path`` itself, or the ``.py`` files under it in name order; the folders left out
    that are not hidden nor ``__pycache__`` are added to ``skipped``."""
    if not path.is_dir():
        yield path
        return
    for root, dirs, files in os.walk(path):
        kept = []
        for d in sorted(dirs):
            if d.startswith(".") or d == "__pycache__":
                continue
            if _left_out(root, d):
                if skipped is not None:
                    skipped.append(Path(root, d))
                continue
            kept.append(d)
        dirs[:] = kept
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(root, name)


def _problems(path: Path) -> list[str]:
    """The lines to print for one file (raises SyncscopeError: a bad file)."""
    from syncscope.fixes.driver import _decode, _read

    data = _read(path)
    if b"backward" not in data:
        return []
    from syncscope.fixes.codemod import fix_source

    source, _encoding = _decode(path, data)
    result = fix_source(source, path=str(path))
    return [f"{path}:{p.line}: {p.code} {p.message}" for p in result.problems]


def _shown(text: str, stream: TextIO) -> str:
    """``text`` as ``stream``'s encoding can carry it (PYTHONIOENCODING=ascii: a file name
    ``é.py`` is written ``\\xe9.py``), never an encoding error."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        return text.encode(encoding, "backslashreplace").decode(encoding, "replace")
    except LookupError:
        return text.encode("ascii", "backslashreplace").decode("ascii")


def _say(message: str) -> None:
    print(_shown(message, sys.stderr), file=sys.stderr)


def _emit(lines: list[str]) -> bool:
    """Print the lines; False when stdout was closed by its reader."""
    try:
        sys.stdout.write(_shown("".join(f"{line}\n" for line in lines), sys.stdout))
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes at exit
        return False
    return True


def check_paths(paths: Sequence[Path]) -> int:
    """Check every file; returns the exit status (2 bad input, 1 problems, 0 clean)."""
    status = 0
    skipped: list[Path] = []
    for given in paths:
        if not given.exists():
            _say(f"syncscope: error: {given}: no such file or directory")
            status = 2
            continue
        for path in python_files(given, skipped):
            try:
                lines = _problems(path)
            except SyncscopeError as exc:
                _say(f"syncscope: error: {exc}")
                status = 2
                continue
            if lines and not _emit(lines):
                return max(status, 1)  # the reader went away (``| head``): the answer stands
            if lines and status == 0:
                status = 1
    if skipped:
        _say(skipped_line(skipped))
    return status


def skipped_line(skipped: list[Path], shown: int = 5) -> str:
    """The one line that names the folders not checked (the first ``shown`` of them)."""
    names = [f"{p}{os.sep}" for p in skipped[:shown]]
    more = f" and {len(skipped) - shown} more" if len(skipped) > shown else ""
    return (
        f"syncscope: not checked: {', '.join(names)}{more} (build, dist, virtual environments, "
        "symbolic links to folders); name a folder to check it"
    )
