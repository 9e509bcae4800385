"""``syncscope fix --check PATH...``: the loops ``fix`` would rewrite, for CI and pre-commit.

Reads the code only (nothing is run, imported or written): every ``.py`` file given, and
under every directory given (hidden folders, ``__pycache__``, virtual environments,
``site-packages`` and ``node_modules`` left out). One line per problem on stdout,
``file:line: SYNxxx message``, as ``fix`` prints them; exit status 1 if any, 0 if none,
2 if a path is missing or a file cannot be read or parsed (one line each, the other files
still checked).

A file whose text never says ``backward`` holds no accumulation loop the rules know, so it
is not parsed at all: most of a code base costs one read.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from syncscope.errors import SyncscopeError

__all__ = ["check_paths", "python_files"]

SKIPPED_DIRS = frozenset(
    {"__pycache__", "site-packages", "node_modules", "venv", "env", "build", "dist"}
)


def python_files(path: Path) -> Iterator[Path]:
    """``path`` itself, or the ``.py`` files under it in name order."""
    if not path.is_dir():
        yield path
        return
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".")
            and d not in SKIPPED_DIRS
            and not (Path(root, d) / "pyvenv.cfg").exists()
        )
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(root, name)


def _problems(path: Path) -> list[str]:
    """The lines to print for one file (raises SyncscopeError: a bad file)."""
    from syncscope.fixes.pipeline import _decode, _read

    data = _read(path)
    if b"backward" not in data:
        return []
    from syncscope.fixes.codemod import fix_source

    source, _encoding = _decode(path, data)
    result = fix_source(source, path=str(path))
    return [f"{path}:{p.line}: {p.code} {p.message}" for p in result.problems]


def _emit(lines: list[str]) -> bool:
    """Print the lines; False when stdout was closed by its reader."""
    try:
        sys.stdout.write("".join(f"{line}\n" for line in lines))
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes at exit
        return False
    return True


def check_paths(paths: Sequence[Path]) -> int:
    """Check every file; returns the exit status (2 bad input, 1 problems, 0 clean)."""
    status = 0
    for given in paths:
        if not given.exists():
            print(f"syncscope: error: {given}: no such file or directory", file=sys.stderr)
            status = 2
            continue
        for path in python_files(given):
            try:
                lines = _problems(path)
            except SyncscopeError as exc:
                print(f"syncscope: error: {exc}", file=sys.stderr)
                status = 2
                continue
            if lines and not _emit(lines):
                return max(status, 1)  # the reader went away (``| head``): the answer stands
            if lines and status == 0:
                status = 1
    return status
