"""The process that builds the compiled kernel: ``python -m syncscope.capture.native.builder``.

It runs in a session of its own (started with ``start_new_session``), so every process of
the build (ninja, the compiler driver, ``cc1plus``: ninja gives each command a process group
of its own, but not a session) can be found and stopped with it:

- SIGTERM, SIGINT or SIGHUP: it kills every other process of its session, removes torch's
  lock file and its own note that a build is under way, and exits;
- ``--parent PID`` (a build someone waits for: ``syncscope build-kernel``, the test suite):
  the kernel sends it SIGTERM when that process dies, even by SIGKILL (``PR_SET_PDEATHSIG``);
- a build still running after its time limit is stopped the same way, as a failure.

Without ``--parent`` it is the background build ``syncscope profile`` starts: it outlives the
run that started it, and takes only CPU time nothing else wants: Linux's ``SCHED_IDLE``
policy and nice 19, which ninja and the compiler inherit, and its compiler is stopped
(SIGSTOP) while any ``syncscope profile`` is under way (the runs lock,
``cache.hold_for_run``), so a later run is not slowed by it; ``syncscope build-kernel``
stops it and builds at normal priority. It is stopped after
``BACKGROUND_LIMIT_S`` (a machine busy all that time), a build someone waits for after
``BUILD_LIMIT_S``. One builder at a time per module (``syncscope-build.lock``); a second
exits at once with status ``BUSY``. Exit 0: the module is built, imported once and
checksummed; 1: the build failed, and the failure is remembered with the toolchain.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from syncscope.capture.native import cache

BUSY = 3  # another builder holds the lock
_PR_SET_PDEATHSIG = 1
_INTERRUPTED = "the last build did not finish (it was killed or crashed)"


def session_members(sid: int) -> list[int]:
    """Every process of session ``sid`` but this one (Linux ``/proc``)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) "
        if len(fields) > 3 and fields[3] == str(sid):
            members.append(int(entry.name))
    return members


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` but this one, until none is left (bounded)."""
    for _ in range(20):
        members = session_members(sid)
        if not members:
            return
        for pid in members:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


class _Build:
    def __init__(self, where: cache.Place, limit_s: float) -> None:
        self.where = where
        self.limit_s = limit_s
        self.started = time.monotonic()
        self.holds_torch_lock = False
        self.ended = threading.Lock()
        self.paused = False  # its compiler stopped while a run is under way

    def stop(self, reason: str | None, status: int) -> None:
        """End the build now: every process of the session killed, torch's lock removed,
        ``reason`` remembered as the failure (None: an interruption, nothing remembered)."""
        if not self.ended.acquire(blocking=False):
            return
        kill_session(os.getsid(0))
        if self.holds_torch_lock:
            with contextlib.suppress(OSError):
                self.where.file(cache.TORCH_LOCK).unlink()
        if reason is None:
            cache.forget_failure(self.where)
        else:
            cache.remember_failure(self.where, reason)
        print(f"syncscope: build stopped: {reason or 'interrupted'}", flush=True)
        os._exit(status)

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop(None, 128 + signum)

    def watchdog(self) -> None:
        """Stop the build once it has worked ``limit_s`` seconds (paused time not counted)."""
        worked, tick = 0.0, 0.5
        while worked < self.limit_s:
            time.sleep(tick)
            worked += 0.0 if self.paused else tick
        busy = " at idle priority (the machine was busy)" if idle_priority(os.getpid()) else ""
        self.stop(f"the build took longer than {self.limit_s:.0f} s{busy} and was stopped", 1)

    def pause_while_runs(self) -> None:
        """The background build's compiler stopped (SIGSTOP to every other process of the
        session) while a ``syncscope profile`` holds the runs lock, continued after: a run
        never shares the machine with it, even where idle CPU is not free (a VM's CPU
        quota counts it all)."""
        while True:
            running = cache.runs_under_way(self.where)
            if running or self.paused:
                for pid in session_members(os.getsid(0)):
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGSTOP if running else signal.SIGCONT)
                self.paused = running
            time.sleep(0.25)


def idle_priority(pid: int) -> bool:
    """Whether process ``pid`` runs on idle CPU only (``SCHED_IDLE``; False where unknown)."""
    try:
        return os.sched_getscheduler(pid) == os.SCHED_IDLE
    except (OSError, AttributeError):
        return False


def _take_idle_cpu_only() -> None:
    """This process, and every process it starts from now on, at the lowest priority there
    is: ``SCHED_IDLE`` (Linux: run only on a core nothing else wants) and nice 19 (which
    is all there is elsewhere). Both are inherited across fork and exec."""
    with contextlib.suppress(OSError):
        os.nice(19 - os.nice(0))
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _follow_parent(parent: int) -> None:
    """SIGTERM to this process when ``parent`` dies (Linux); gone already: exit now."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(128 + signal.SIGTERM)


def _log_to(where: cache.Place) -> None:
    """This process's output, and its children's, into the build log from now on."""
    fd = os.open(where.file(cache.LOG), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (the process's own)
    sys.stderr = sys.stdout
    print(f"syncscope-builder pid {os.getpid()}", flush=True)


def _wait_for_torch_lock(where: cache.Place) -> None:
    """Wait while a live build may hold torch's lock file; break it once it is stale."""
    while where.file(cache.TORCH_LOCK).exists():
        note = cache.stale_torch_lock(where)
        if note:
            print(f"syncscope: note: {note}", flush=True)
            return
        time.sleep(0.5)


def failure_reason(log: Path, exc: BaseException) -> str:
    """One line: the compiler's first error in the build log, else the exception's last line."""
    with contextlib.suppress(OSError):
        text = log.read_text(errors="replace")
        for line in text.splitlines():
            if re.search(r"\b(fatal )?error\b:", line):
                return line.strip()[:300]
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return (lines[-1].strip() if lines else type(exc).__name__)[:300]


def build(where: cache.Place, background: bool = False) -> int:
    """Build, import once and checksum the module, holding the build lock (``background``:
    nobody waits on it, so it pauses while runs are under way and may take longer)."""
    state = _Build(where, cache.BACKGROUND_LIMIT_S if background else cache.BUILD_LIMIT_S)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, state.on_signal)
    threading.Thread(target=state.watchdog, daemon=True).start()
    if background:  # nobody waits on it: runs go first
        threading.Thread(target=state.pause_while_runs, daemon=True).start()
    if not cache.verify(where):
        print(f"syncscope: {where.so} is built and verified", flush=True)
        return 0
    cache.remember_failure(where, _INTERRUPTED)  # replaced below however the build ends
    _wait_for_torch_lock(where)
    cache.clear(where)
    state.holds_torch_lock = True
    try:
        from torch.utils.cpp_extension import load

        load(
            where.name,
            [str(cache.SOURCE)],
            extra_cflags=["-O2"],
            build_directory=str(where.directory),
            verbose=True,
        )
        seconds = time.monotonic() - state.started
        cache.stamp(where, seconds)
    except Exception as exc:  # a compiler error, no ninja, a module that does not import
        state.holds_torch_lock = False
        reason = failure_reason(where.file(cache.LOG), exc)
        cache.remember_failure(where, reason)
        print(f"syncscope: build failed: {reason}", flush=True)
        return 1
    state.holds_torch_lock = False
    cache.forget_failure(where)
    print(f"syncscope: built {where.so} in {seconds:.1f} s", flush=True)
    return 0


def main(argv: list[str]) -> int:
    if os.getsid(0) != os.getpid():  # stopping "its session" must never reach a shell's
        try:
            os.setsid()
        except OSError:
            print("syncscope: the builder runs in a session of its own: use build-kernel")
            return 2
    waited_on = argv[:1] == ["--parent"] and len(argv) == 2 and argv[1].isdigit()
    if waited_on:
        _follow_parent(int(argv[1]))
    else:  # in the background: the machine's other work first (it only saves later runs)
        _take_idle_cpu_only()
    where = cache.place()
    why = cache.prepare(where)
    if why:
        print(f"syncscope: {why}", flush=True)
        return 1
    fd = cache.try_lock(where)
    if fd is None:
        return BUSY
    _log_to(where)
    return build(where, background=not waited_on)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
