"""``syncscope profile --trace``: a torch.profiler (Kineto) trace of a range of windows.

The capture calls the ``ProfilerTrace`` hooks; this module starts ``torch.profiler`` on the
first window of the range, marks windows, micro-batches and grad syncs with
``record_function`` ranges, and exports ``out_dir/traces/rank-R.json.gz`` when the range
ends (or at ``close()``). The names it writes are the ones ``syncscope.load.trace`` reads back:

- ``syncscope.window#N`` around window N (N from 0);
- ``syncscope.micro_batch#N.K`` around micro-batch K of window N;
- ``syncscope.grad_sync#OP#BYTES``, a near-zero-length range where a grad sync was issued.

The trace opens in Perfetto or chrome://tracing with the windows visible. Nothing here
depends on the rest of the capture, and a failure to export never stops training: it is
reported by ``close()``'s return of ``self.error``.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.autograd.profiler import record_function

WINDOW_PREFIX = "syncscope.window#"
MICRO_BATCH_PREFIX = "syncscope.micro_batch#"
GRAD_SYNC_PREFIX = "syncscope.grad_sync#"


# what Kineto writes to stderr at each start and stop (torch 2.13, CPU and CUDA alike)
_USDT = re.compile(rb"^USDT:.*\] profiler_(start|stop)\s*$")


@contextlib.contextmanager
def without_usdt_lines() -> Iterator[None]:
    """Run the block with file descriptor 2 sent to a temporary file, then write back to the
    real stderr everything but Kineto's ``USDT: ... profiler_start/stop`` lines: torch's
    noise that syncscope caused is kept out, anything else written meanwhile is kept."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    try:
        with tempfile.TemporaryFile() as tmp:
            os.dup2(tmp.fileno(), 2)
            try:
                yield
            finally:
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    sys.stderr.flush()
                os.dup2(saved, 2)
                tmp.seek(0)
                kept = [line for line in tmp.read().splitlines(True) if not _USDT.match(line)]
                if kept:
                    os.write(2, b"".join(kept))
    finally:
        os.close(saved)


def trace_path(out_dir: Path, rank: int) -> Path:
    return out_dir / "traces" / f"rank-{rank}.json.gz"


class ProfilerTrace:
    """Records windows ``[first, stop)`` of ``windows`` (all windows when None)."""

    def __init__(self, out_dir: Path, rank: int, windows: tuple[int, int] | None) -> None:
        if windows is not None and (windows[0] < 0 or windows[1] <= windows[0]):
            raise ValueError(f"bad window range {windows[0]}:{windows[1]} (want A:B, 0 <= A < B)")
        self.path = trace_path(out_dir, rank)
        self.rank = rank
        self.windows = windows
        self.error: str | None = None
        self._profiler: torch.profiler.profile | None = None
        self._done = False
        self._window: Any = None
        self._micro_batch: Any = None
        self._micro_label = ""
        self._lock = threading.Lock()
        self._restore: Callable[[], None] | None = None
        self._last = -1  # the last window begun

    @property
    def active(self) -> bool:
        return self._profiler is not None

    def _in_range(self, index: int) -> bool:
        return self.windows is None or self.windows[0] <= index < self.windows[1]

    def _start(self) -> None:
        if torch.autograd.profiler._is_profiler_enabled:
            # a second profiler under the script's own crashes the process (SIGSEGV, torch
            # 2.13): the script's profiler wins, and the counting capture goes on
            self._skip(
                "no trace: the script runs its own torch.profiler, and syncscope does not start a "
                "second one under it (the script's trace is its own; the counting report "
                "is complete)"
            )
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        profiler = torch.profiler.profile(activities=activities, record_shapes=True)
        with without_usdt_lines():
            profiler.__enter__()
        self._profiler = profiler
        self._yield_to_the_scripts(profiler)

    def _yield_to_the_scripts(self, ours: torch.profiler.profile) -> None:
        """The script starts its own profiler while syncscope's runs: syncscope's trace ends
        there (exported as it is), then the script's starts, alone."""
        cls = torch.profiler.profile
        real_start = cls.start

        def start(profiler: torch.profiler.profile) -> None:
            if profiler is not ours and cls.start is start:
                cls.start = real_start  # type: ignore[method-assign]
                with self._lock:
                    if self._profiler is ours:
                        self._close_range("_micro_batch")
                        self._close_range("_window")
                        self._finish()
                        self._say(
                            "the script started its own torch.profiler: syncscope's trace "
                            "stops there (a second profiler under the script's crashes it)"
                        )
            real_start(profiler)

        cls.start = start  # type: ignore[method-assign,assignment]

        def restore() -> None:
            if cls.start is start:
                cls.start = real_start  # type: ignore[method-assign]

        self._restore = restore

    def window_begin(self, index: int) -> None:
        with self._lock:
            self._last = max(self._last, index)
            if self._done or not self._in_range(index):
                return
            if self._profiler is None:
                self._start()
                if self._profiler is None:
                    return
            self._close_range("_micro_batch")
            self._close_range("_window")
            self._window = self._open_range(f"{WINDOW_PREFIX}{index}")

    def micro_batch_begin(self, window: int, micro_batch: int) -> None:
        """Open the micro-batch's range. The recorder calls this at the forward and again at
        the backward of one micro-batch: the range opened at the forward stays open, so the
        trace holds one range per micro-batch, from its forward to the end of its backward."""
        label = f"{MICRO_BATCH_PREFIX}{window}.{micro_batch}"
        with self._lock:
            if self._profiler is None or (
                self._micro_batch is not None and self._micro_label == label
            ):
                return
            self._close_range("_micro_batch")
            self._micro_batch = self._open_range(label)
            self._micro_label = label

    def micro_batch_end(self, window: int, micro_batch: int) -> None:
        with self._lock:
            self._close_range("_micro_batch")

    def grad_sync(self, op: str, nbytes: int) -> None:
        with self._lock:
            if self._profiler is None:
                return
            marker = self._open_range(f"{GRAD_SYNC_PREFIX}{op}#{int(nbytes)}")
            marker.__exit__(None, None, None)

    def window_end(self, index: int) -> None:
        with self._lock:
            if self._profiler is None:
                return
            self._close_range("_micro_batch")
            self._close_range("_window")
            if self.windows is not None and index >= self.windows[1] - 1:
                self._finish()

    def close(self) -> None:
        with self._lock:
            self._close_range("_micro_batch")
            self._close_range("_window")
            if self._profiler is not None:
                self._finish()
            elif not self._done and self.windows is not None:
                first, stop = self.windows
                ran = f"window {self._last} was its last" if self._last >= 0 else "no window ran"
                self._say(
                    f"no trace: --trace-windows {first}:{stop}, and the job ended before window "
                    f"{first} ({ran}); the counting report is complete"
                )
            self._done = True

    # -- internals ---------------------------------------------------------------------

    def _skip(self, reason: str) -> None:
        """No trace from this rank: why, next to where the trace would be (report and
        analyze show it as a note), and said once on the job's terminal (rank 0)."""
        self._done = True
        self.error = None
        self._say(reason)

    def _say(self, reason: str) -> None:
        """Why the trace is missing or short: next to where the trace is (report and analyze
        show it as a note), and once on the job's terminal (rank 0)."""
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.with_name(f"rank-{self.rank}.not-traced").write_text(reason + "\n")
        if self.rank == 0:
            print(f"syncscope: note: --trace: {reason}", file=sys.stderr, flush=True)

    @staticmethod
    def _open_range(name: str) -> Any:
        rf = record_function(name)
        rf.__enter__()
        return rf

    def _close_range(self, attr: str) -> None:
        rf = getattr(self, attr)
        if rf is not None:
            setattr(self, attr, None)
            with contextlib.suppress(RuntimeError):  # closed on another thread, or stopped
                rf.__exit__(None, None, None)

    def _finish(self) -> None:
        profiler, self._profiler = self._profiler, None
        self._done = True
        restore, self._restore = self._restore, None
        if restore is not None:
            restore()
        if profiler is None:
            return
        try:
            with without_usdt_lines():
                profiler.__exit__(None, None, None)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            profiler.export_chrome_trace(str(self.path))
        except (OSError, RuntimeError) as exc:
            self.error = f"{self.path}: could not write the trace: {exc}"
