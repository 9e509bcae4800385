"""Read trace files in worker processes (``main``, started by ``Pool``).

``Pool(n).map(files)`` starts ``n`` fresh interpreters that import only the trace reader
(not the CLI, not torch), hands each the next file as it finishes one, and yields the
files' ``RankResult`` in file order. A worker holds one file's events at a time and sends
back only the reduced rank, so the parent never sees raw events.

Frames on the pipes: one kind byte, an 8-byte length, a pickle. Parent to worker: the path
(``J``). Worker to parent: bytes read so far (``P``, for the progress bar), the result
(``R``), or a traceback (``E``) for an unexpected failure.
"""

from __future__ import annotations

import os
import pickle
import selectors
import struct
import subprocess
import sys
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from syncscope.load.trace.rankfile import read_rank

_HEADER = struct.Struct("<cQ")
_PROGRESS_EVERY = 4 << 20
_PATH_ENV = "SYNCSCOPE_WORKER_PATH"
# Files handed to a worker ahead, when this process reads files too: a second one while the
# next is small, so a worker does not wait for this process to finish its own file; a large
# one waits to be handed out (queued, it could leave a worker the last two large files).
_QUEUED = 2
_SMALL_BYTES = 16 << 20


def _read_exact(fd: int, n: int) -> bytes:
    parts: list[bytes] = []
    while n:
        data = os.read(fd, min(n, 1 << 20))
        if not data:
            raise EOFError
        parts.append(data)
        n -= len(data)
    return b"".join(parts)


def _send(fd: int, kind: bytes, obj: Any) -> None:
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    data = memoryview(_HEADER.pack(kind, len(payload)) + payload)
    while data:
        data = data[os.write(fd, data) :]


def _receive(fd: int) -> tuple[bytes, Any]:
    kind, size = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    return kind, pickle.loads(_read_exact(fd, size))


def main() -> int:
    """The worker: read paths from stdin, write results to stdout, until stdin closes."""
    inp, out = sys.stdin.fileno(), sys.stdout.fileno()
    sys.stdout = sys.stderr  # nothing else may write to the result pipe
    while True:
        try:
            _, path = _receive(inp)
        except EOFError:
            return 0
        pending = 0

        def advance(n: int) -> None:
            nonlocal pending
            pending += n
            if pending >= _PROGRESS_EVERY:
                _send(out, b"P", pending)
                pending = 0

        try:
            result = read_rank(path, advance)
        except Exception:  # reported to the parent, which raises it there
            _send(out, b"E", traceback.format_exc())
            continue
        if pending:
            _send(out, b"P", pending)
        _send(out, b"R", result)


class Pool:
    """``n`` worker processes; ``map`` yields one ``RankResult`` per file, in file order."""

    def __init__(self, n: int) -> None:
        # ``-S``: no site import (on some installs that alone costs 5 MB and 50 ms a worker);
        # the worker gets this interpreter's import path instead.
        paths = [p for p in sys.path if p and os.path.isdir(p)]
        env = dict(os.environ)
        env[_PATH_ENV] = os.pathsep.join(paths)
        # glibc's malloc as it comes: MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ at 128 KiB
        # cost 18% CPU per file for 4 MB less peak RSS (6 x 40 MB files, 3 repetitions)
        boot = (
            "import os, sys; sys.path[:0] = os.environ.pop('SYNCSCOPE_WORKER_PATH').split(os.pathsep)\n"
            "from syncscope.load.trace.worker import main; raise SystemExit(main())"
        )
        cmd = [sys.executable, "-S", "-c", boot]
        self.procs: list[subprocess.Popen[bytes]] = []
        for _ in range(n):
            self.procs.append(
                subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
            )

    def __enter__(self) -> Pool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self, wait: float = 0.0) -> None:
        """Stop the workers: let them end their input and exit within ``wait`` s, else kill."""
        for proc in self.procs:
            if proc.stdin is not None and not proc.stdin.closed:
                proc.stdin.close()
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        self.procs = []

    def map(
        self,
        files: list[Path],
        advance: Callable[[int], None] | None,
        sizes: list[int] | None = None,
    ) -> Iterator[Any]:
        """``sizes`` (each file's bytes on disk): this process reads files too, one at a
        time while no worker has a result to hand back (each worker keeps a second small
        file queued meanwhile, so it does not wait for this one): a worker fewer does the
        same work. Without them, only the workers read."""
        read_here = sizes is not None
        sel = selectors.DefaultSelector()
        todo = deque(enumerate(files))
        working: dict[int, tuple[subprocess.Popen[bytes], deque[int]]] = {}  # fd -> queued
        done: dict[int, Any] = {}
        following = 0
        left = len(files)

        def small_next() -> bool:  # (a second file is queued only while this one reads)
            return sizes is not None and (not todo or sizes[todo[0][0]] < _SMALL_BYTES)

        def hand_out(proc: subprocess.Popen[bytes], queued: deque[int]) -> None:
            assert proc.stdin is not None and proc.stdout is not None
            while not queued or (len(queued) < _QUEUED and small_next()):
                if not todo:
                    if not queued:
                        sel.unregister(proc.stdout.fileno())
                        proc.stdin.close()  # the worker exits when its input ends
                        del working[proc.stdout.fileno()]
                    return
                index, path = todo.popleft()
                _send(proc.stdin.fileno(), b"J", path)
                queued.append(index)

        try:
            for proc in self.procs:
                assert proc.stdout is not None
                sel.register(proc.stdout.fileno(), selectors.EVENT_READ)
                working[proc.stdout.fileno()] = (proc, deque())
                hand_out(proc, working[proc.stdout.fileno()][1])
            while left:
                ready = sel.select(timeout=0 if read_here and todo else None)
                for key, _ in ready:
                    fd = int(key.fd)
                    proc, queued = working[fd]
                    try:
                        kind, obj = _receive(fd)
                    except EOFError:
                        raise RuntimeError(
                            f"trace worker stopped (exit status {proc.wait()}) "
                            f"while reading {files[queued[0]]}"
                        ) from None
                    if kind == b"P":
                        if advance is not None:
                            advance(int(obj))
                        continue
                    if kind == b"E":
                        raise RuntimeError(f"trace worker failed on {files[queued[0]]}:\n{obj}")
                    done[queued.popleft()] = obj
                    left -= 1
                    hand_out(proc, queued)
                if read_here and todo and not ready:
                    index, path = todo.popleft()
                    done[index] = read_rank(path, advance)
                    left -= 1
                while following in done:
                    yield done.pop(following)
                    following += 1
            self.close(wait=5.0)  # all done: the workers are exiting
        finally:
            sel.close()
            self.close()


if __name__ == "__main__":
    raise SystemExit(main())
