"""A capture session on one rank: a recorder, its sink and the installed instrumentation."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from syncscope.capture.recorder import MemorySink, Recorder, Sink, TraceHooks
from syncscope.rundir import EventWriter, rank_events_path


class CaptureSession:
    def __init__(self, recorder: Recorder, header: dict[str, Any] | None = None) -> None:
        self.recorder = recorder
        self._header = header or {}
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
    ) -> CaptureSession:
        sink: Sink = EventWriter(rank_events_path(run_dir, rank))
        hooks: TraceHooks | None = None
        if trace:
            from syncscope.capture.profiler import ProfilerTrace

            hooks = ProfilerTrace(run_dir, rank, trace_windows)
        recorder = Recorder(
            sink, rank=rank, world_size=world_size, local_rank=local_rank, trace=hooks
        )
        return cls(recorder, extra)

    @classmethod
    def in_memory(cls, *, rank: int, world_size: int) -> tuple[CaptureSession, MemorySink]:
        sink = MemorySink()
        return cls(Recorder(sink, rank=rank, world_size=world_size)), sink

    def start(self) -> None:
        from syncscope.capture.instrument import install

        self.recorder.header(self._header)
        self._undo = install(self.recorder)

    def close(self, status: int | None = 0, reason: str = "finished") -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self.recorder.footer(status, reason)
        finally:
            if self._undo is not None:
                self._undo()
            self.recorder.sink.close()
