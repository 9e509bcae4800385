"""A capture session on one rank: a recorder, its sink and the installed instrumentation."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

from syncscope.capture.recorder.core import MemorySink, Recorder, Sink, TraceHooks
from syncscope.capture.writer import EventWriter
from syncscope.rundir import rank_events_path


class CaptureSession:
    def __init__(
        self, recorder: Recorder, header: dict[str, Any] | None = None, then: str = "run"
    ) -> None:
        self.recorder = recorder
        self._header = header or {}
        self.then = then  # bounded capture: "run" on without hooks, or "stop" the job
        self._undo: Any = None
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def to_run_dir(
        cls,
        run_dir: Path,
        *,
        rank: int,
        world_size: int,
        local_rank: int = 0,
        trace: bool = False,
        trace_windows: tuple[int, int] | None = None,
        extra: dict[str, Any] | None = None,
        skip_windows: int = 0,
        windows: int | None = None,
        then: str = "run",
    ) -> CaptureSession:
        sink: Sink = EventWriter(rank_events_path(run_dir, rank))
        hooks: TraceHooks | None = None
        if trace:
            from syncscope.capture.profiler import ProfilerTrace

            hooks = ProfilerTrace(
                run_dir, rank, bounded_trace_windows(trace_windows, skip_windows, windows)
            )
        recorder = Recorder(
            sink,
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            trace=hooks,
            skip_windows=skip_windows,
            max_windows=windows,
        )
        header = dict(extra or {})
        if skip_windows or windows is not None:
            header["bounded"] = {"skip_windows": skip_windows, "windows": windows, "then": then}
        return cls(recorder, header, then)

    @classmethod
    def in_memory(cls, *, rank: int, world_size: int) -> tuple[CaptureSession, MemorySink]:
        sink = MemorySink()
        return cls(Recorder(sink, rank=rank, world_size=world_size)), sink

    def start(self) -> None:
        from syncscope.capture import native
        from syncscope.capture.hooks.install import install

        # which kernel records DDP's bucket all-reduces (what capture costs per collective)
        self.recorder.header({**self._header, "collective_kernel": native.describe()})
        self._undo = install(self.recorder)
        self.recorder.on_capture_end = self._capture_end

    def _capture_end(self) -> None:
        """The last bounded window just closed (in the optimizer's step post-hook): write the
        rank's record, let the hooks go at their next safe call, and stop if asked to."""
        rec = self.recorder
        first = rec.skip_windows
        last = rec.window - 1
        with self._lock:
            if self._closed:
                return
            self._closed = True
        how = "stops" if self.then == "stop" else "runs on without hooks"
        try:
            rec.footer(0, f"capture complete: windows {first}-{last}; the job {how}")
        finally:
            rec.sink.close()
            rec.detaching = True
        if rec.rank == 0:
            print(
                f"syncscope: captured windows {first}-{last} (optimizer steps {first + 1}-"
                f"{last + 1}); hooks removed, the job {how}",
                file=sys.stderr,
                flush=True,
            )
        if self.then == "stop":
            # every rank stops at the same step boundary: no collective is left unmatched
            raise SystemExit(0)

    def close(self, status: int | None = 0, reason: str = "finished") -> None:
        with self._lock:
            closed, self._closed = self._closed, True
        try:
            if not closed:  # a bounded capture already wrote its record at its last window
                self.recorder.footer(status, reason)
        finally:
            if self._undo is not None:
                self._undo()  # idempotent: hooks a bounded capture removed stay removed
            self.recorder.sink.close()


def bounded_trace_windows(
    trace: tuple[int, int] | None, skip_windows: int, windows: int | None
) -> tuple[int, int] | None:
    """The trace's window range within the bounded capture's windows."""
    if not skip_windows and windows is None:
        return trace
    start, stop = skip_windows, skip_windows + windows if windows is not None else 10**9
    if trace is not None:
        start, stop = max(start, trace[0]), min(stop, trace[1])
    return (start, max(stop, start + 1)) if stop > start else (start, start + 1)
