"""A rank's heartbeat: what its main thread is doing, for ``syncscope profile``'s monitor.

Under ``syncscope profile`` each rank runs one daemon thread, started by ``syncscope.launch.attach``
before the script (so before its ``init_process_group``), that once every ``BEAT_S`` replaces
``RUN/beats/rank-NNNNN.json`` (written whole, then renamed over the last one) with:

- ``pid``, ``rank``, ``seq`` (counts up by one a beat), ``time`` (wall clock, seconds);
- ``cpu``: the CPU seconds of the rank's *main thread* (not of the process: torch's and
  syncscope's own threads tick while the script waits);
- ``work_cpu``: the CPU seconds the rank's other work has used since the beat thread
  started (counts up): the script's own non-daemon Python threads (a ``threading.Thread``, a
  thread pool; not a daemon thread, not syncscope's, not torch's C++ threads) and every
  process below the rank (a DataLoader worker, a process pool, a subprocess: Linux's
  ``/proc``), so a rank whose main thread waits for work it handed off is not hung;
- ``state``: ``"waiting"`` when the main thread is inside torch.distributed's communication
  (a collective or its wait, a barrier, ``init_process_group``, a rendezvous or the store),
  else ``"running"`` (computing, sleeping, or blocked elsewhere: ``cpu`` tells which);
- ``where``: the script's innermost frame (``file:line``), ``call``: the torch.distributed
  function it called, ``"backward"`` when it runs autograd's backward (where DDP's gradient
  all-reduce is waited for, in C++), ``""`` else;
- ``pg``: whether ``torch.distributed`` has its default process group.

The monitor (``syncscope.launch.torchrun.Monitor``) judges the job's progress on these: a
rank computing while the others wait is not hung. Reading the main thread's stack once a
second (``sys._current_frames``) costs a few microseconds; nothing runs in the script's
thread; the rank's threads and child processes are summed from their CPU clocks and
``/proc`` (a few hundred microseconds with a dozen DataLoader workers). Threads do not
survive ``fork``: a process the script forks writes no beats.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import orjson

from syncscope.capture.sites import is_library_path
from syncscope.rundir import rank_beat_path

__all__ = ["BEAT_S", "describe", "start_heartbeat"]

BEAT_S = 1.0
_SEP = os.sep
_OURS = tuple(
    {os.path.dirname(os.path.dirname(p)) + _SEP for p in (__file__, os.path.realpath(__file__))}
)
# torch.distributed's communication modules: its top-level files (distributed_c10d,
# rendezvous, c10d_logger, _functional_collectives) and the elastic store utilities; not
# fsdp/, tensor/, checkpoint/, which compute in Python between their collectives
_DIST = f"{_SEP}torch{_SEP}distributed{_SEP}"
_AUTOGRAD = f"{_SEP}torch{_SEP}autograd{_SEP}"  # a backward: the engine runs in C++ below


def _ours(filename: str) -> bool:
    return filename.startswith(_OURS) or "runpy" in filename


def _communicating(filename: str) -> bool:
    if _DIST not in filename:
        return False
    rest = filename.rsplit(_DIST, 1)[1]
    return _SEP not in rest or rest.startswith(f"elastic{_SEP}")


@functools.lru_cache(maxsize=4096)
def _library(filename: str) -> bool:
    """Library code, not the script's: capture's own rule (``sites.is_library_path``)."""
    return filename.startswith("<") or is_library_path(os.path.abspath(filename))


def _in_torch(filename: str) -> bool:
    return f"{_SEP}torch{_SEP}" in filename


def describe(frame: FrameType | None) -> dict[str, str]:
    """``state``, ``where`` and ``call`` of a thread whose innermost frame is ``frame``."""
    stack: list[FrameType] = []
    while frame is not None:
        stack.append(frame)  # innermost first
        frame = frame.f_back
    theirs = [f for f in stack if not _ours(f.f_code.co_filename)]
    waiting = bool(theirs) and _communicating(theirs[0].f_code.co_filename)
    call = ""
    if waiting:
        dist = [f.f_code.co_name for f in theirs if _communicating(f.f_code.co_filename)]
        public = [n for n in dist if not n.startswith("_") and n != "wrapper"]
        call = (public or dist)[-1]  # the outermost: what the script called
    elif theirs and _AUTOGRAD in theirs[0].f_code.co_filename:
        call = "backward"  # idle there: DDP's gradient all-reduce (or the device) holds it
    user = [f for f in theirs if not _in_torch(f.f_code.co_filename)]
    script = [f for f in user if not _library(f.f_code.co_filename)]
    chosen = (script or user or theirs or stack)[:1]
    where = f"{chosen[0].f_code.co_filename}:{chosen[0].f_lineno}" if chosen else ""
    return {"state": "waiting" if waiting else "running", "where": where, "call": call}


def _main_cpu(ident: int | None) -> float | None:
    """The main thread's CPU seconds (Linux, macOS; None where the clock cannot be had)."""
    try:
        return round(time.clock_gettime(time.pthread_getcpuclockid(ident or 0)), 4)
    except (AttributeError, OSError, TypeError):
        return None


def _has_process_group() -> bool:
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized())
    except Exception:
        return False


def _thread_cpu() -> dict[int, float]:
    """CPU seconds of each of the script's non-daemon Python threads but the main one
    (thread id -> seconds): the threads Python waits for at exit, where the script's work
    runs (a ``threading.Thread``, a ``ThreadPoolExecutor``); not a daemon thread (a logger,
    a monitor), not syncscope's own, not a C++ thread that merely ran Python (torch's)."""
    main = threading.main_thread()
    cpu: dict[int, float] = {}
    for thread in threading.enumerate():
        ident = thread.ident
        if (
            thread is main
            or ident is None
            or thread.daemon  # a background helper (logging, a monitor), not the script's work
            or thread.name.startswith("syncscope-")
            or isinstance(thread, threading._DummyThread)  # type: ignore[attr-defined]
        ):
            continue
        with contextlib.suppress(AttributeError, OSError, TypeError, ValueError):
            cpu[ident] = time.clock_gettime(time.pthread_getcpuclockid(ident))
    return cpu


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux: every thread's ``children`` file)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError):
                text = Path(f"/proc/{pid}/task/{task}/children").read_text()
                found.extend(int(word) for word in text.split())
    return found


def process_ticks(pid: int) -> int | None:
    """The user and system CPU clock ticks of process ``pid``, every thread of it (Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat.rpartition(b")")[2].split()
    try:
        return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    except (IndexError, ValueError):
        return None


def descendants(pid: int, limit: int = 1000) -> list[int]:
    """Every process below ``pid`` (children, their children, ...), at most ``limit``."""
    found: list[int] = []
    todo = _children(pid)
    while todo and len(found) < limit:
        child = todo.pop()
        if child not in found:
            found.append(child)
            todo.extend(_children(child))
    return found


_TICK_S = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


class WorkClock:
    """The CPU seconds of a rank's work off its main thread, counted up beat after beat: each
    thread's and each descendant process's advance since the beat before (a new one counts
    from zero; one that ended stops counting)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.total = 0.0
        self._threads: dict[int, float] = {}
        self._procs: dict[int, int] = {}

    def read(self) -> float:
        threads = _thread_cpu()
        for ident, seconds in threads.items():
            self.total += max(0.0, seconds - self._threads.get(ident, 0.0))
        self._threads = threads
        procs: dict[int, int] = {}
        for child in descendants(self.pid):
            ticks = process_ticks(child)
            if ticks is not None:
                procs[child] = ticks
                self.total += max(0, ticks - self._procs.get(child, 0)) * _TICK_S
        self._procs = procs
        return round(self.total, 4)


def beat(rank: int, seq: int, work: WorkClock | None = None) -> dict[str, Any]:
    """This process's beat now (read from any thread)."""
    main = threading.main_thread()
    frame = sys._current_frames().get(main.ident or 0)
    state = describe(frame)
    del frame
    return {
        "pid": os.getpid(),
        "rank": rank,
        "seq": seq,
        "time": round(time.time(), 3),
        "cpu": _main_cpu(main.ident),
        "work_cpu": work.read() if work is not None else 0.0,
        **state,
        "pg": _has_process_group(),
    }


def start_heartbeat(run_dir: Path, rank: int, interval: float = BEAT_S) -> threading.Event:
    """Start the beat thread; the returned event stops it. A failed write (a full disk, the
    directory gone) skips that beat: the monitor then reads the thread's CPU from /proc."""
    path = rank_beat_path(run_dir, rank)
    stop = threading.Event()
    pid = os.getpid()

    def run() -> None:
        seq = 0
        work = WorkClock(pid)
        with contextlib.suppress(OSError):
            path.parent.mkdir(exist_ok=True)  # never the run directory itself
        while os.getpid() == pid:
            seq += 1
            try:
                data = orjson.dumps(beat(rank, seq, work))
                partial = path.with_name(f".{path.name}.{pid}")
                partial.write_bytes(data + b"\n")
                os.replace(partial, path)
            except Exception:  # never a traceback on the script's stderr from this thread
                pass
            if stop.wait(interval):
                return

    threading.Thread(target=run, name="syncscope-heartbeat", daemon=True).start()
    return stop
