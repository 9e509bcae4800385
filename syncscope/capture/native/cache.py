"""Where the compiled kernel is built, and what is known of it there.

One directory per module name (source, torch and Python) under torch's extension root
(``TORCH_EXTENSIONS_DIR``, else torch's default), holding, besides torch's build files:

- ``syncscope-kernel.json``: the built module's size and SHA-256, written by the builder once
  the module imported. A module is loaded only when it matches (a truncated or overwritten
  ``.so`` is never mapped: that killed every rank with SIGBUS);
- ``syncscope-failed.json``: the last build's failure and the toolchain it failed with (the
  compiler's and ninja's paths, sizes and times); while that toolchain is unchanged, no run
  starts the build again (``syncscope build-kernel`` does);
- ``syncscope-build.lock``: held (``flock``) by the one builder at work; the kernel frees it
  when the builder dies, however it dies;
- ``syncscope-build.log``: the last build's output;
- ``syncscope-runs.lock``: held shared (``flock``) by every ``syncscope profile`` while it
  runs; the background build pauses its compiler while any run holds it.

Nothing here imports torch at import time, and nothing raises for a bad directory: each
check returns the reason in words.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("c10d_kernel.cpp")
STAMP = "syncscope-kernel.json"
FAILED = "syncscope-failed.json"
LOCK = "syncscope-build.lock"
LOG = "syncscope-build.log"
RUNS_LOCK = "syncscope-runs.lock"
TORCH_LOCK = "lock"  # torch.utils.cpp_extension's FileBaton: a file that exists while it builds
# a build that takes longer is stopped, and a torch lock file older than this is stale
BUILD_LIMIT_S = 600.0
# the background build runs on idle CPU only: on a busy machine it may take this long
BACKGROUND_LIMIT_S = 3600.0
# a torch lock this old with no process working in the build directory is stale too
IDLE_LOCK_S = 30.0
_KEEP = {LOCK, LOG, FAILED, TORCH_LOCK, RUNS_LOCK}  # kept when a build starts afresh


@dataclass(frozen=True)
class Place:
    """The build directory of one module name, and the files syncscope keeps there."""

    directory: Path
    name: str

    @property
    def so(self) -> Path:
        return self.directory / f"{self.name}.so"

    def file(self, name: str) -> Path:
        return self.directory / name


def module_name() -> str:
    """The extension's name: one per source, torch and Python (a change rebuilds it)."""
    import torch

    digest = hashlib.sha256()
    digest.update(SOURCE.read_bytes())
    digest.update(torch.__version__.encode())
    digest.update(sys.version.encode())
    return f"syncscope_c10d_{digest.hexdigest()[:16]}"


def extensions_root() -> Path:
    """torch's extension root, as ``torch.utils.cpp_extension._get_build_directory`` finds
    it, without creating anything."""
    given = os.environ.get("TORCH_EXTENSIONS_DIR")
    if given is not None:
        return Path(given)
    import torch
    from torch.utils.cpp_extension import get_default_build_root

    if torch.version.hip is not None:
        accelerator = f"rocm{torch.version.hip.replace('.', '')}"
    elif torch.version.cuda is not None:
        accelerator = f"cu{torch.version.cuda.replace('.', '')}"
    else:
        accelerator = "cpu"
    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return Path(get_default_build_root()) / f"{python}_{accelerator}"


def place() -> Place:
    name = module_name()
    return Place(extensions_root() / name, name)


def place_of(so: Path) -> Place:
    """The place of a module given by its path (``SYNCSCOPE_NATIVE_PATH``)."""
    return Place(so.parent, so.stem)


def prepare(where: Place) -> str:
    """Make the build directory, writable: "" or why it cannot be used (one line)."""
    try:
        where.directory.mkdir(parents=True, exist_ok=True)
        if not os.access(where.directory, os.W_OK | os.X_OK):
            return f"the extension directory {where.directory} is not writable"
    except OSError as exc:
        return f"cannot use the extension directory {where.directory}: {_why(exc)}"
    return ""


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_json(path: Path) -> dict[str, Any] | None:
    """A small JSON object syncscope wrote, or None (missing, unreadable, damaged)."""
    try:
        with path.open("rb") as f:
            data = json.loads(f.read(1 << 16))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Written whole or not at all (a temporary file renamed over it)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def verify(where: Place) -> str:
    """Empty when the built module is the one the builder checksummed, else why not."""
    try:
        size = where.so.stat().st_size
    except (FileNotFoundError, NotADirectoryError):
        return "not built"
    except OSError as exc:
        return f"cannot read {where.so}: {_why(exc)}"
    stamp = read_json(where.file(STAMP))
    if stamp is None:
        return f"{where.so} has no checksum (not built by this syncscope, or its build was cut off)"
    if stamp.get("size") != size:
        return f"{where.so} is damaged ({size} bytes where {stamp.get('size')} were built)"
    try:
        digest = sha256(where.so)
    except OSError as exc:
        return f"cannot read {where.so}: {_why(exc)}"
    if stamp.get("sha256") != digest:
        return f"{where.so} is damaged (its checksum differs from the build's)"
    return ""


def stamp(where: Place, seconds: float) -> None:
    write_json(
        where.file(STAMP),
        {"size": where.so.stat().st_size, "sha256": sha256(where.so), "build_s": seconds},
    )


def forget_built(where: Place) -> None:
    """The built module is not trusted from now on (its checksum removed): built again."""
    with contextlib.suppress(FileNotFoundError):
        where.file(STAMP).unlink()


def clear(where: Place) -> None:
    """Remove what an earlier build left (the module, its checksum, objects, ninja's
    files): ninja would otherwise call a truncated module up to date."""
    for entry in where.directory.iterdir():
        if entry.name in _KEEP:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()


# -- the toolchain, and a failure remembered with it ----------------------------------------


def compiler() -> str:
    return os.environ.get("CXX", "c++")


def _identity(program: str) -> str:
    found = shutil.which(program)
    if found is None:
        return f"{program}: missing"
    real = os.path.realpath(found)
    try:
        info = os.stat(real)
    except OSError:
        return f"{real}: unreadable"
    return f"{real} {info.st_size} {info.st_mtime_ns}"


def toolchain() -> dict[str, str]:
    """What a failed build is remembered with: a change to any of it tries again."""
    return {"compiler": _identity(compiler()), "ninja": _identity("ninja")}


def missing_tool() -> str:
    """Empty when a C++ compiler and ninja are found, else which is not (one line)."""
    if shutil.which(compiler()) is None:
        named = "CXX=" + compiler() if "CXX" in os.environ else "c++"
        return f"no C++ compiler ({named} not found)"
    if shutil.which("ninja") is None:
        return "no ninja (pip install ninja)"
    return ""


def remembered_failure(where: Place) -> str:
    """The reason of the last failed build with this toolchain ("" if none)."""
    memo = read_json(where.file(FAILED))
    if memo is None or memo.get("toolchain") != toolchain():
        return ""
    reason = memo.get("reason")
    return reason if isinstance(reason, str) and reason else "the build failed"


def remember_failure(where: Place, reason: str) -> None:
    with contextlib.suppress(OSError):
        write_json(where.file(FAILED), {"toolchain": toolchain(), "reason": reason})


def forget_failure(where: Place) -> None:
    with contextlib.suppress(FileNotFoundError):
        where.file(FAILED).unlink()


# -- the build lock ------------------------------------------------------------------------


def try_lock(where: Place) -> int | None:
    """Take the build lock (a descriptor, kept until the process ends) or None if a builder
    holds it. Raises OSError when the lock file cannot be opened."""
    fd = os.open(where.file(LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def _held(path: Path, flag: int) -> bytes | None:
    """The first bytes of ``path`` where another process holds a lock on it that ``flag``
    (``LOCK_SH`` or ``LOCK_EX``) cannot be had beside, else None (no file, or not held)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, flag | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.read(fd, 32)
    finally:
        os.close(fd)  # frees the lock it took, if it took it
    return None


def builder_pid(where: Place) -> int | None:
    """The pid of the builder at work in ``where``, or None when none is."""
    held = _held(where.file(LOCK), fcntl.LOCK_SH)
    if held is None:
        return None
    text = held.decode(errors="replace").strip()
    return int(text) if text.isdigit() else 0


def hold_for_run(where: Place) -> int | None:
    """Say that a run is under way until this process ends (a shared lock on the runs
    lock file, which the kernel frees however the process ends): a descriptor, or None
    where the lock file cannot be had."""
    try:
        fd = os.open(where.file(RUNS_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while a builder looks (a moment)
    except OSError:
        os.close(fd)
        return None
    return fd


def runs_under_way(where: Place) -> bool:
    """Whether a process holds ``hold_for_run``'s lock on ``where`` now."""
    return _held(where.file(RUNS_LOCK), fcntl.LOCK_EX) is not None


def stale_torch_lock(where: Place, now: float | None = None) -> str:
    """Why torch's lock file in ``where`` is stale (it is then removed), or "" (none, or one
    a live build may hold). Stale: older than a build can take, or older than
    ``IDLE_LOCK_S`` with no process working in the directory (ninja and the compiler run
    there)."""
    lock = where.file(TORCH_LOCK)
    try:
        age = (time.time() if now is None else now) - lock.stat().st_mtime
    except OSError:
        return ""
    if age <= IDLE_LOCK_S or (age <= BUILD_LIMIT_S and _working_in(where.directory)):
        return ""
    with contextlib.suppress(FileNotFoundError):
        lock.unlink()
    return f"removed torch's lock file {lock}, left {age:.0f} s ago by a build that did not end"


def _working_in(directory: Path) -> bool:
    """Whether a process's working directory is ``directory`` (Linux; True where unknown)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    target = str(directory.resolve())
    for entry in proc.iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "cwd") == target:
                    return True
    return False
