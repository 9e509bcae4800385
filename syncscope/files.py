"""Writing a file whole or not at all: the one way syncscope writes the files it produces.

``atomic_write`` writes into a new temporary file beside the target and renames it over the
target, so a reader (or a crash, a full disk, a Ctrl-C) sees the old file or the new one,
never a torn one. Reports, ``meta.json``, re-rendered pages and fixed scripts all go
through it. A symlink is written through, to the file it names; a file replaced keeps its
permission bits.

This module imports nothing beyond the standard library's core (no tempfile, no threading):
``syncscope analyze`` writes its reports through it and keeps its imports few.
"""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO

from syncscope.errors import SyncscopeError

_serial = itertools.count()


def atomic_write(
    path: Path, content: bytes | Callable[[IO[bytes]], None], *, durable: bool = False
) -> None:
    """Write ``content`` (bytes, or a function writing to a binary file) to ``path``.

    ``durable``: also fsync the data before the rename (a user's own source file).
    Any failure leaves ``path`` as it was, removes the temporary file and raises
    SyncscopeError naming ``path``.
    """
    target = Path(os.path.realpath(path))
    try:
        temporary = _create_beside(target)
    except OSError as exc:
        raise SyncscopeError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with temporary.open("wb") as out:
            if isinstance(content, bytes):
                out.write(content)
            else:
                content(out)
            if durable:
                out.flush()
                os.fsync(out.fileno())
        if target.exists():  # the file replaced keeps its permission bits
            os.chmod(temporary, stat.S_IMODE(os.stat(target).st_mode))
        os.replace(temporary, target)
    except BaseException as exc:
        temporary.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise SyncscopeError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise


def _create_beside(target: Path) -> Path:
    """A new, empty, hidden file in ``target``'s directory that no other writer has."""
    while True:
        candidate = target.with_name(f".{target.name}.{os.getpid()}.{next(_serial)}.tmp")
        try:
            with open(candidate, "xb"):  # exclusive: never a file another writer made
                return candidate
        except FileExistsError:
            continue


def fresh_name(path: Path) -> Path:
    """``path``, else ``path.1``, ``path.2`` ...: the first name no file has."""
    candidate, n = path, 0
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


def copy_fresh(source: Path, wanted: Path) -> Path:
    """Copy ``source`` to a new file named like ``wanted`` (never over an existing one)."""
    data = source.read_bytes()
    while True:
        path = fresh_name(wanted)
        try:
            with open(path, "xb") as out:  # exclusive: a file made meanwhile is not replaced
                out.write(data)
        except FileExistsError:
            continue
        import shutil  # here: analyze, which writes through this module, never needs it

        shutil.copystat(source, path)
        return path
