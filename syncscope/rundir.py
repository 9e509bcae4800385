"""The run directory: a versioned on-disk format written by capture and read by everything else.

Layout (format ``syncscope-run``, version 1; see docs/formats.md)::

    RUN/
      meta.json                 run metadata (command, world size, launcher options, versions)
      ranks/rank-00000.jsonl    one JSON object per line per rank, appended as things happen
      report.json, report.html  rendered outputs (derived; can be regenerated)

Event files are written one line per event with a single ``write(2)``, so a crash, a kill
or a hang keeps every event up to then; a torn last line is ignored on reading.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from syncscope.errors import BadRunDirectory
from syncscope.files import NotRegularFile, atomic_write, open_regular, read_regular

RUN_FORMAT = "syncscope-run"
RUN_FORMAT_VERSION = 1
EVENTS_FORMAT = "syncscope-events"
EVENTS_FORMAT_VERSION = 2  # 2: a group's ranks once, in a ``pg`` event (1: on every ``coll``)
META_FILE = "meta.json"
META_MAX_BYTES = 16 << 20  # meta.json: a command line and notes; more is not one
EVENT_MAX_BYTES = 16 << 20  # one event line (a huge group list was ~100 KB a line)
RANKS_DIR = "ranks"


def rank_events_path(run_dir: Path, rank: int) -> Path:
    return run_dir / RANKS_DIR / f"rank-{rank:05d}.jsonl"


def is_run_dir(path: Path) -> bool:
    return (path / META_FILE).is_file() or (path / RANKS_DIR).is_dir()


def prepare_run_dir(run_dir: Path) -> None:
    """Create RUN/ and RUN/ranks/ (its missing parents too, like ``mkdir -p``), with one
    clear error when that is impossible."""
    for parent in run_dir.parents:
        if parent.exists():
            if not parent.is_dir():
                raise BadRunDirectory(
                    f"--out {run_dir}: cannot create ({parent} is not a directory)"
                )
            break
    try:
        (run_dir / RANKS_DIR).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadRunDirectory(f"--out {run_dir}: cannot create ({exc.strerror})") from None
    if not os.access(run_dir / RANKS_DIR, os.W_OK):
        raise BadRunDirectory(f"--out {run_dir}: not writable")
    if any((run_dir / RANKS_DIR).iterdir()):
        raise BadRunDirectory(f"--out {run_dir}: already holds a run; choose a new directory")


LOCK_FILE = ".syncscope-profile.lock"


def lock_run_dir(run_dir: Path) -> Path:
    """Claim RUN/ for one ``profile`` (a file made with O_EXCL, holding this process's id), so
    a second run started on the same ``--out`` is refused instead of interleaving its ranks'
    files with the first's. A lock left by a process that has died is taken over."""
    path = run_dir / LOCK_FILE
    for _ in range(3):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            holder = _lock_holder(path)
            if _lock_held(path, holder):
                raise BadRunDirectory(
                    f"--out {run_dir}: another syncscope profile (pid {holder}) is writing "
                    "there; choose a new directory"
                ) from None
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # stale: its process is gone
            continue
        except OSError as exc:
            raise BadRunDirectory(f"--out {run_dir}: cannot lock ({exc.strerror})") from None
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return path
    raise BadRunDirectory(f"--out {run_dir}: another syncscope profile is starting there")


def unlock_run_dir(lock: Path) -> None:
    with contextlib.suppress(OSError):
        if _lock_holder(lock) == os.getpid():
            lock.unlink()


def _lock_held(path: Path, holder: int | None) -> bool:
    if holder is None:  # just created, its id not yet written: held unless it is old
        try:
            return time.time() - path.stat().st_mtime < 10
        except OSError:
            return False
    return _pid_alive(holder)


def _lock_holder(path: Path) -> int | None:
    try:
        text = path.read_text()[:32].strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has ended
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]


ATTEMPTS_DIR = "attempts"


def set_aside_attempt(run_dir: Path, rank: int, restart: int) -> None:
    """A restarted job (torchrun ``--max-restarts``; ``restart`` is TORCHELASTIC_RESTART_COUNT):
    move this rank's file of the attempt before into RUN/attempts/attempt-K/ranks/ (with a copy
    of meta.json, so it reads as a run of its own), so each attempt's file has one header and
    RUN/ranks/ holds the last attempt only."""
    path = rank_events_path(run_dir, rank)
    if restart < 1 or not path.is_file():
        return
    attempt = run_dir / ATTEMPTS_DIR / f"attempt-{restart - 1}"
    with contextlib.suppress(FileExistsError):
        (attempt / RANKS_DIR).mkdir(parents=True, exist_ok=True)
    os.replace(path, attempt / RANKS_DIR / path.name)
    meta = run_dir / META_FILE
    if meta.is_file() and not (attempt / META_FILE).exists():
        with contextlib.suppress(OSError):
            atomic_write(attempt / META_FILE, meta.read_bytes())


def record_launcher_exit(run_dir: Path, rank: int, signal_name: str, status: int) -> bool:
    """A rank killed by a signal it could not record (SIGSEGV, SIGKILL, SIGABRT): append the
    exit the launcher saw to its file, unless the rank recorded its own. True if written."""
    path = rank_events_path(run_dir, rank)
    try:
        if not path.is_file() or path.stat().st_size > 1 << 30:
            return False
        with path.open("rb") as fh:
            data = fh.read()
        if b'"type":"exit"' in data:
            return False
        record = {
            "type": "exit",
            "t": _last_time(data),  # when it was last seen: the order of failures holds
            "status": status,
            "reason": f"killed by signal {signal_name} (seen by the launcher)",
            "by": "launcher",
        }
        with path.open("ab") as fh:
            fh.write(
                (b"" if data.endswith(b"\n") or not data else b"\n") + orjson.dumps(record) + b"\n"
            )
    except OSError:
        return False
    return True


def _last_time(data: bytes) -> int:
    for line in reversed(data.splitlines()[-50:]):
        with contextlib.suppress(orjson.JSONDecodeError, LookupError, TypeError, ValueError):
            return int(orjson.loads(line)["t"])
    return 0


def earlier_attempts(run_dir: Path) -> list[Path]:
    """The earlier attempts of a restarted job set aside by ``set_aside_attempt``."""
    root = run_dir / ATTEMPTS_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith("attempt-") and p.is_dir())


def write_meta(run_dir: Path, meta: dict[str, Any]) -> None:
    data = {"format": RUN_FORMAT, "format_version": RUN_FORMAT_VERSION, **meta}
    atomic_write(run_dir / META_FILE, (json.dumps(data, indent=2) + "\n").encode("utf-8"))


def read_meta(run_dir: Path) -> dict[str, Any]:
    path = run_dir / META_FILE
    if not path.exists():
        return {}
    try:
        data = json.loads(read_regular(path, META_MAX_BYTES))
    except NotRegularFile as exc:
        raise BadRunDirectory(f"{path}: {exc.args[0].split(' is ', 1)[1]}") from None
    except OSError as exc:
        raise BadRunDirectory(f"{path}: cannot read ({exc.strerror})") from None
    except ValueError as exc:
        raise BadRunDirectory(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != RUN_FORMAT:
        raise BadRunDirectory(f"{path}: not a syncscope run (format is not {RUN_FORMAT!r})")
    version = data.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise BadRunDirectory(
            f"{path}: format_version is {version!r}, not a whole number from 1 (the file was "
            "edited or written by something else)"
        )
    if version > RUN_FORMAT_VERSION:
        raise BadRunDirectory(
            f"{path}: run format version {version!r} is newer than this syncscope reads "
            f"({RUN_FORMAT_VERSION}); upgrade syncscope"
        )
    return data


FAULT_ENV = "SYNCSCOPE_FAULT_WRITE_ENOSPC"  # test seam: the N-th event write fails (ENOSPC)
STOPPED_SUFFIX = ".stopped"  # RUN/ranks/rank-NNNNN.jsonl.stopped: why capture stopped there


def _os_write(fd: int, data: bytes) -> int:
    """``os.write``, or the fault the test seam asks for (a module attribute to patch)."""
    return os.write(fd, data)


def _faulty_write(after: int) -> Any:
    count = 0

    def write(fd: int, data: bytes) -> int:
        nonlocal count
        count += 1
        if count >= after:
            import errno

            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data)

    return write


_LINE = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE


FLUSH_INTERVAL_S = 0.1  # held events reach the file at least this often (EventWriter)


class EventWriter:
    """Appends one JSON line per event to a rank's event file (thread-safe).

    Events come in two ways. ``write`` puts an event (and every one held before it) on disk
    at once, in one system call: the header, the exit record, the rare ones. ``buffer``
    holds an event in memory, and a background thread of the writer (the flusher) puts
    what is held on disk every ``FLUSH_INTERVAL_S``, in one system call: the training
    thread neither serializes nor makes a system call on its hook path (two writes per
    optimizer step cost about 45 us of a ~9 ms step there, more than their bytes suggest:
    every one ran with cold caches). The flusher runs whenever the training thread waits in
    C++ with Python's lock released (a collective's wait, a backward), so a rank that hangs
    there has its events, the hanging collective's record included, on disk within the
    interval. A rank killed outright (SIGKILL, a segfault) loses at most its last interval
    of events. ``flush`` writes what is held now (before a blocking collective).

    A failed write (disk full, directory gone, permissions changed) never reaches the
    training script: the writer stops for good, keeps the reason in ``stopped``, says so
    once on stderr and tries to leave ``rank-NNNNN.jsonl.stopped`` with the reason (on a
    full disk that may fail too; the report then infers it from the missing exit record).
    Everything written before stays. In a process forked from the rank (a multiprocessing
    pool) the writer is inert: the child's events are not the rank's.
    """

    def __init__(self, path: Path, flush_interval: float = FLUSH_INTERVAL_S) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._pid = os.getpid()
        self.stopped = ""  # why capture stopped on this rank ("" while writing)
        fault = os.environ.get(FAULT_ENV, "")
        self._write = _faulty_write(int(fault)) if fault.isdigit() else None
        import threading  # only capture writes events: analyze never loads threading
        import weakref

        self._lock = threading.Lock()  # one drain at a time
        # events held until the next drain: appended without the lock (a deque's append and
        # popleft are atomic), so holding one costs the training thread no lock
        self._held: collections.deque[dict[str, Any] | tuple[Any, ...]] = collections.deque()
        self._interval = flush_interval
        self._flusher: threading.Thread | None = None  # started by the first buffer()
        self._closing = threading.Event()
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forget_in_child(ref))

    def write(self, event: dict[str, Any]) -> None:
        """Write ``event``, after any held by ``buffer``, in one system call."""
        with self._lock:
            self._held.append(event)
            self._drain()

    def buffer(self, event: dict[str, Any] | tuple[Any, ...]) -> None:
        """Hold ``event`` (not copied: the caller lets go of it), or a hot hook's record of
        one (``syncscope.capture.records``), made into its event when written; the flusher
        writes it within ``FLUSH_INTERVAL_S``, or the next ``write`` or ``flush`` does,
        whichever comes first.

        Once the flusher runs, the instance's ``buffer`` is the deque's own ``append`` (no
        Python frame on a hook's path); once nothing can be written any more (closed,
        stopped after a failed write, a forked child's copy) it is ``_discard``."""
        self._held.append(event)
        if self._flusher is None:
            self._start_flusher()

    def flush(self) -> None:
        with self._lock:
            if self._held:
                self._drain()

    def _start_flusher(self) -> None:
        import threading
        import weakref

        if self._fd is None or os.getpid() != self._pid:
            return  # stopped, or a forked child: nothing is written here
        self._flusher = threading.Thread(
            target=_flush_every,
            args=(weakref.ref(self), self._closing, self._interval),
            name="syncscope-writer",
            daemon=True,
        )
        self._flusher.start()
        self.__dict__["buffer"] = self._held.append  # see buffer()

    def _drain(self) -> None:
        """Write every held event in one system call (the lock is held)."""
        held = self._held
        from syncscope.capture.records import event_of  # only capture drains: analyze never

        items = [held.popleft() for _ in range(len(held))]  # appends meanwhile stay held
        self._put(b"".join([orjson.dumps(event_of(e), option=_LINE) for e in items]))

    def _put(self, data: bytes) -> None:
        """Write ``data`` (the lock is held)."""
        if self._fd is None or os.getpid() != self._pid:
            return
        try:
            (self._write or _os_write)(self._fd, data)
        except OSError as exc:
            self._stop(exc)

    def _stop(self, exc: OSError) -> None:
        """Stop for good after a failed write (the lock is held)."""
        import sys

        self.stopped = f"cannot write {self.path}: {exc.strerror or exc}"
        self._closing.set()  # the flusher has nothing more to do
        self.__dict__["buffer"] = _discard  # nothing held from now on (it would only grow)
        self._held.clear()
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(OSError):
            marker = self.path.with_name(self.path.name + STOPPED_SUFFIX)
            marker.write_text(self.stopped + "\n")
        rank = self.path.stem.rsplit("-", 1)[-1].lstrip("0") or "0"
        with contextlib.suppress(OSError, ValueError):
            print(
                f"syncscope: capture stopped on rank {rank}: {self.stopped}; the script continues",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        self._closing.set()
        flusher, self._flusher = self._flusher, None
        if flusher is not None and flusher.is_alive():
            flusher.join(timeout=1.0)  # at most one drain in progress
        self.flush()
        with self._lock:
            self.__dict__["buffer"] = _discard  # what comes after the close is not written
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _discard(event: Any) -> None:
    """A closed or stopped writer's ``buffer``, and a forked child's: the event is dropped."""


def _flush_every(ref: Any, stop: Any, interval: float) -> None:
    """The flusher: writes what ``ref``'s writer holds every ``interval`` seconds, until it
    is closed or collected (it holds the writer only while it writes)."""
    while not stop.wait(interval):
        writer = ref()
        if writer is None:
            return
        try:
            writer.flush()
        except Exception:  # never a traceback on the user's stderr from this thread
            return
        del writer


def _forget_in_child(ref: Any) -> None:
    """After fork, in the child: drop the inherited descriptor, write nothing."""
    writer = ref()
    if writer is not None:
        import threading

        writer._fd = None
        writer._held = collections.deque()
        writer.__dict__["buffer"] = _discard
        writer._lock = threading.Lock()  # one held by another thread at fork stays held
        writer._flusher = None  # threads do not survive a fork; none is started (no fd)


def stopped_reason(events_file: Path) -> str:
    """Why capture stopped early on a rank, when its writer could leave the marker."""
    marker = events_file.with_name(events_file.name + STOPPED_SUFFIX)
    try:
        return read_regular(marker, 4096).decode(errors="replace").strip()[:300]
    except (OSError, ValueError):
        return ""


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    """Yield a rank's events; a torn final line (the process died mid-write) is skipped, and
    so is a line longer than EVENT_MAX_BYTES (no event is: it is not one). Read as a stream
    of lines, from a regular file only (NotRegularFile otherwise, raised before reading)."""
    try:
        file = open_regular(path)
    except NotRegularFile:
        raise
    except OSError as exc:
        raise BadRunDirectory(f"{path}: cannot read ({exc.strerror})") from None
    with file:
        yield from _events_of(file)


def _events_of(file: IO[bytes]) -> Iterator[dict[str, Any]]:
    while True:
        raw = file.readline(EVENT_MAX_BYTES + 1)
        if not raw:
            return
        if len(raw) > EVENT_MAX_BYTES:  # skip the rest of an overlong line, bounded reads
            while raw and not raw.endswith(b"\n"):
                raw = file.readline(EVENT_MAX_BYTES)
            continue
        if not raw.strip():
            continue
        try:
            event = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(event, dict):
            yield event


def rank_files(run_dir: Path) -> list[Path]:
    directory = run_dir / RANKS_DIR
    if not directory.is_dir():
        return []
    return sorted(directory.glob("rank-*.jsonl"))
