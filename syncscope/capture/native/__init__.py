"""The compiled kernel for DDP's bucket all-reduces (``c10d_kernel.cpp``), where it can be had.

syncscope's Python kernel (``syncscope.capture.hooks.collectives``) costs each collective it sees
a Python frame: entering it from the dispatcher, converting the op's arguments, walking the
stack for the issuer: on a small DDP step, the largest single part of what capture costs
(x1.023 of a 4 x 512 MLP rank's CPU time, most of it in gloo's threads: see docs/concepts.md).
The compiled kernel sits in front of the Python one, at the ``Autograd`` key of
``c10d::allreduce_``, and records the calls that are DDP bucket all-reduces (issued straight
from the autograd engine, inside a backward the recorder saw) itself: the same record, in the
same order, to the same sink. Every other call goes on to the Python kernel (then at
``ADInplaceOrView``), unchanged. The same module holds ``GradSampler``, the copy of a gradient
fingerprint's samples at an optimizer step (``syncscope.capture.fingerprint``): the bytes
torch's views and ``torch.cat`` copy, in one call.

It is C++ built against the torch in use (torch's C++ ABI changes between releases, so no
wheel could ship it): ``torch.utils.cpp_extension`` compiles it once per source, torch and
Python, into torch's extension directory, in a process of its own
(``syncscope.capture.native.builder``; where it lives and what is kept there:
``syncscope.capture.native.cache``). Nothing waits on that build unless asked to:
``syncscope build-kernel`` (and ``build()``) builds it in the foreground; ``syncscope
profile`` runs on the Python kernel while it is not built and starts the build in the
background once its run ends, for the next runs, on idle CPU only (``readiness()``, ``start_background()``),
and passes a built module to the ranks (``NATIVE_PATH_ENV``); ``track()``, the pytest plugin
and ``attach`` use it only if it was built before. A module is loaded only when its checksum
is the one its build recorded. Without it capture records exactly the same, at the Python
kernel's cost; the header of each rank's event file says which kernel ran and why.
``SYNCSCOPE_NATIVE`` set to 0, false, no or off turns it off.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from syncscope.capture.native import cache

SOURCE = cache.SOURCE
ENV = "SYNCSCOPE_NATIVE"  # a false word: never use the compiled kernel
NATIVE_PATH_ENV = "SYNCSCOPE_NATIVE_PATH"  # the built module, set by `syncscope profile`
_FALSE = ("0", "false", "no", "off")
_TRUE = ("", "1", "true", "yes", "on")

_loaded: list[Any] = []  # [module] once imported in this process
_why_not: list[str] = []  # [reason] once it could not be had
_background: list[subprocess.Popen[bytes]] = []  # the builder started by this process


def setting() -> tuple[str, bool]:
    """(``SYNCSCOPE_NATIVE``'s value, whether the compiled kernel may be used); ValueError,
    in one line, for a value that is neither a usual true nor false word."""
    value = os.environ.get(ENV, "")
    word = value.strip().lower()
    if word in _FALSE or word in _TRUE:
        return value, word not in _FALSE
    raise ValueError(
        f"{ENV}={value!r} is not a value it takes: 0, false, no or off (the Python kernel); "
        "1, true, yes or on, or unset (the compiled kernel where it is built)"
    )


def _import(path: Path) -> Any:
    import torch  # noqa: F401 (the module links against torch's libraries, loaded first)

    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get() -> Any | None:
    """The compiled module, if built and verified (never built here); None, with
    ``why_not()``, if not."""
    if _loaded:
        return _loaded[0]
    if _why_not:
        return None
    _why_not.append(_load())
    if _loaded:
        _why_not.clear()
        return _loaded[0]
    return None


def _load() -> str:
    """Import the module into ``_loaded``: "" or why not."""
    try:
        value, on = setting()
    except ValueError as exc:
        return str(exc)
    if not on:
        return f"{ENV}={value}"
    given = os.environ.get(NATIVE_PATH_ENV, "")
    try:
        where = cache.place_of(Path(given)) if given else cache.place()
        why = cache.verify(where)
        if why:
            return f"{given} is missing" if given and why == "not built" else why
        _loaded.append(_import(where.so))
    except Exception as exc:  # a module built for another torch, a damaged cache
        return f"cannot load it: {exc}"
    return ""


def describe() -> str:
    """For the event file's header: "compiled", or "python (why)"."""
    return "compiled" if get() is not None else f"python ({why_not()})"


def failed(reason: str) -> None:
    """The module loaded but its kernel could not be registered: not used from now on."""
    _loaded.clear()
    _why_not[:] = [reason]


def why_not() -> str:
    """Why ``get()`` found no module ("" if it did, or was not asked)."""
    return _why_not[0] if _why_not else ""


# -- before a run: ``syncscope profile`` --------------------------------------------------


@dataclass(frozen=True)
class Readiness:
    """What a run can have: a verified module for its ranks, one line for the user, and
    whether to build it in the background once the run ends."""

    path: Path | None = None
    note: str = ""
    build: bool = False


def _no_kernel(why: str) -> str:
    return (
        f"no compiled collective kernel ({why}); capture records the same with its Python "
        "kernel, at a higher cost per collective"
    )


def readiness() -> Readiness:
    """What ``syncscope profile`` can use now; it builds nothing and waits on nothing.
    ValueError (one line) for a ``SYNCSCOPE_NATIVE`` it does not know."""
    if not setting()[1]:
        return Readiness()
    try:
        where = cache.place()
    except Exception as exc:  # a torch that cannot say where its extensions go
        return Readiness(note=_no_kernel(f"no extension directory: {exc}"))
    why = cache.verify(where)
    if not why:  # a directory it cannot write holds a module it can use
        return Readiness(path=where.so)
    unusable = cache.prepare(where)
    if unusable:
        return Readiness(note=_no_kernel(unusable))
    log = where.file(cache.LOG)
    pid = cache.builder_pid(where)
    if pid is not None:
        return Readiness(
            note=f"the compiled collective kernel is being built in the background (pid {pid}, "
            f"log {log}); this run records the same with the Python kernel"
        )
    missing = cache.missing_tool()
    if missing:
        return Readiness(note=_no_kernel(missing))
    failure = cache.remembered_failure(where)
    if failure:
        tried = f"its last build failed: {failure}; log {log}; 'syncscope build-kernel' retries"
        return Readiness(note=_no_kernel(tried))
    state = "is not built yet" if why == "not built" else f"is rebuilt: {why}"
    return Readiness(
        note=f"the compiled collective kernel {state}; it builds in the background once this "
        "run ends, for the next runs ('syncscope build-kernel' builds it now); this run "
        "records the same with the Python kernel",
        build=True,
    )


def hold_for_run() -> None:
    """Tell a background build that a run is under way in this process, until it ends: the
    build pauses its compiler meanwhile (``syncscope profile``, before its ranks start).
    Nothing where the compiled kernel is off or its directory unusable."""
    try:
        if not setting()[1]:
            return
        where = cache.place()
        if cache.prepare(where):
            return
    except Exception:  # a torch that cannot say where its extensions go: nothing to pause
        return
    fd = cache.hold_for_run(where)
    if fd is not None:
        _run_holds.append(fd)


_run_holds: list[int] = []  # this process's runs lock, held until it exits


def _builder_command(parent: bool) -> list[str]:
    command = [sys.executable, "-m", "syncscope.capture.native.builder"]
    return [*command, "--parent", str(os.getpid())] if parent else command


def _builder_env() -> dict[str, str]:
    """The environment with this syncscope importable first (a source checkout too)."""
    root = str(Path(__file__).resolve().parents[3])
    path = os.environ.get("PYTHONPATH", "")
    return dict(os.environ, PYTHONPATH=root + (os.pathsep + path if path else ""))


def _spawn(parent: bool) -> subprocess.Popen[bytes]:
    directory = cache.place().directory
    return subprocess.Popen(
        _builder_command(parent),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=directory,
        env=_builder_env(),
        start_new_session=True,  # its own session: stopped as a whole, deaf to the terminal
    )


def start_background() -> int:
    """Start the build in a process of its own that outlives this one; its pid."""
    proc = _spawn(parent=False)
    _background.append(proc)
    return proc.pid


# -- in the foreground: ``syncscope build-kernel``, the test suite ------------------------


def build(
    progress: Callable[[str], None] | None = None, tick: Callable[[], None] | None = None
) -> tuple[Path | None, str]:
    """Build the module now unless it is built and verified, and wait for it: (its path,
    "") or (None, why not). ``progress`` is handed each line of the build's log as it comes,
    ``tick`` called a few times a second meanwhile. A build already under way (another
    process's) is waited for rather than doubled."""
    try:
        value, on = setting()
    except ValueError as exc:
        return None, str(exc)
    if not on:
        return None, f"{ENV}={value}"
    try:
        where = cache.place()
    except Exception as exc:
        return None, f"no extension directory: {exc}"
    why = cache.prepare(where) if cache.verify(where) else ""
    if why:
        return None, why
    for _ in range(3):  # ours, or the one under way and then ours
        if not cache.verify(where):
            return where.so, ""
        missing = cache.missing_tool()
        if missing:
            return None, missing
        status = _run_builder(where, progress, tick)
        if status != _busy():
            break
        if _stop_idle_builder(where, progress):
            continue
        _wait_for_builder(where, progress, tick)
        if cache.remembered_failure(where):
            break
    if not cache.verify(where):
        return where.so, ""
    return None, f"cannot build it: {cache.remembered_failure(where) or cache.verify(where)}"


def _busy() -> int:
    from syncscope.capture.native.builder import BUSY

    return BUSY


def _run_builder(
    where: cache.Place, progress: Callable[[str], None] | None, tick: Callable[[], None] | None
) -> int:
    """Run a builder tied to this process, following its log; its exit status. Interrupted
    (Ctrl-C), the builder is stopped with every process of its build."""
    proc = _spawn(parent=True)
    log = _Log(where.file(cache.LOG), proc.pid, progress)
    try:
        while proc.poll() is None:
            log.read()
            if tick is not None:
                tick()
            time.sleep(0.2)
        log.read()
    except BaseException:
        _stop(proc)
        raise
    return proc.returncode


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (it cleans up after itself), then SIGKILL for whatever of its session is left."""
    from syncscope.capture.native.builder import kill_session

    proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    kill_session(proc.pid)
    proc.kill()
    proc.wait()


def _stop_idle_builder(where: cache.Place, progress: Callable[[str], None] | None) -> bool:
    """Stop the background build under way (it runs on idle CPU only, so on a busy machine
    it may take very long) for one at normal priority: whether it was stopped."""
    from syncscope.capture.native.builder import idle_priority

    pid = cache.builder_pid(where)
    if not pid or not idle_priority(pid):
        return False
    try:
        os.kill(pid, signal.SIGTERM)  # it stops every process of its build, then exits
    except OSError:  # gone already, or another user's
        return cache.builder_pid(where) is None
    deadline = time.monotonic() + 10
    while cache.builder_pid(where) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    if progress is not None:
        progress(f"syncscope: stopped the background build (pid {pid}, on idle CPU) to build now")
    return cache.builder_pid(where) is None


def _wait_for_builder(
    where: cache.Place, progress: Callable[[str], None] | None, tick: Callable[[], None] | None
) -> None:
    """Wait for another process's build (it stops itself after ``BUILD_LIMIT_S``)."""
    pid = cache.builder_pid(where)
    if pid is not None and progress is not None:
        progress(f"syncscope: waiting for the build under way (pid {pid})")
    deadline = time.monotonic() + cache.BUILD_LIMIT_S + 30
    while cache.builder_pid(where) is not None and time.monotonic() < deadline:
        if tick is not None:
            tick()
        time.sleep(0.2)


class _Log:
    """The build log's new lines, once it is this builder's (its first line names it)."""

    def __init__(self, path: Path, pid: int, progress: Callable[[str], None] | None) -> None:
        self.path = path
        self.first = f"syncscope-builder pid {pid}"
        self.progress = progress
        self.offset = 0
        self.ours = False

    def read(self) -> None:
        if self.progress is None:
            return
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset if self.ours else 0)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        lines = data[:end].decode(errors="replace").splitlines()
        if not self.ours:  # an earlier build's log until the builder starts its own
            if not lines or lines[0] != self.first:
                return
            self.ours, lines = True, lines[1:]
        self.offset += end
        for line in lines:
            self.progress(line)
