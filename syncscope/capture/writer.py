"""``EventWriter``: how a rank appends its events to its file in the run directory.

Capture's side of the event files whose format syncscope/rundir.py defines (docs/formats.md):
one JSON line per event, held in memory and written by a background thread in one system
call, so a crash, a kill or a hang keeps every event up to its last interval.
"""

from __future__ import annotations

import collections
import contextlib
import os
from pathlib import Path
from typing import Any

import orjson

from syncscope.rundir import STOPPED_SUFFIX, utf8

FAULT_ENV = "SYNCSCOPE_FAULT_WRITE_ENOSPC"  # test seam: the N-th event write fails (ENOSPC)


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
    of events. ``flush`` writes what is held now (before a blocking collective's call, its
    own record among them: a backend that aborts the process inside the call, gloo on a
    size mismatch, leaves it on disk).

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
        one (``syncscope.capture.recorder.records``), made into its event when written; the flusher
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
        # only capture drains: analyze never imports these
        from syncscope.capture.fingerprint import rss_bytes
        from syncscope.capture.recorder.records import event_of, needs_mem

        items = [held.popleft() for _ in range(len(held))]  # appends meanwhile stay held
        mem = rss_bytes() if needs_mem(items) else 0  # one read per drain, not per step
        try:
            data = b"".join([orjson.dumps(event_of(e, mem), option=_LINE) for e in items])
        except TypeError:  # a file name that is not UTF-8 (surrogates): written as \xNN
            data = b"".join([orjson.dumps(utf8(event_of(e, mem)), option=_LINE) for e in items])
        self._put(data)

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
