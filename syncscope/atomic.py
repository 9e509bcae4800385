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


class NotRegularFile(OSError):
    """A path that is a FIFO, a device, a socket or a directory where a file was expected."""


def open_regular(path: Path) -> IO[bytes]:
    """``path`` opened for reading, if it is a regular file (a symlink is followed to one).

    Opened non-blocking first, so a FIFO (which would block the open until a writer came)
    or a device is refused at once with NotRegularFile, never read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = (
                "a FIFO"
                if stat.S_ISFIFO(mode)
                else "a directory"
                if stat.S_ISDIR(mode)
                else (
                    "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"
                )
            )
            raise NotRegularFile(f"{path} is {kind}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: Path, limit: int) -> bytes:
    """A regular file's bytes, at most ``limit`` (more: ValueError naming the size)."""
    with open_regular(path) as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit >> 20} MiB")
    return data


def write_output(path: Path, content: bytes | Callable[[IO[bytes]], None]) -> None:
    """Write a user-named output: a regular file (or a new one) whole or not at all, through
    ``atomic_write``; a FIFO, a terminal or another device (``/dev/stdout``,
    ``/proc/self/fd/1``) is written to directly, never replaced by a regular file."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = 0
    if not mode or stat.S_ISREG(mode):
        atomic_write(path, content)
        return
    if stat.S_ISDIR(mode):
        raise SyncscopeError(f"{path}: is a directory; name a file to write")
    try:
        with open(path, "wb") as out:
            if callable(content):
                content(out)
            else:
                out.write(content)
    except OSError as exc:  # /dev/full, a FIFO whose reader left, a device that refuses
        raise SyncscopeError(f"cannot write {path}: {exc.strerror or exc}") from None


def new_folder(base: Path) -> Path:
    """Create ``base``, or ``base-2``, ``base-3``... when it exists: atomically (mkdir fails
    on an existing folder), so concurrent analyses started in the same second never share
    one."""
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SyncscopeError(f"cannot create {base.parent}: {exc.strerror}") from None
    for n in range(1, 10_000):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            raise SyncscopeError(f"cannot create {path}: {exc.strerror}") from None
        return path
    raise SyncscopeError(f"cannot create {base}: 10,000 folders of that name exist")
