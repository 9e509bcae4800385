"""The recorder's watch over asynchronous work (a part of ``Recorder``).

Collectives in flight (their ``done`` record is held once one is found completed, at the
rank's next event) and fingerprints whose device-side value is not ready yet (their ``fp``
event follows once it is). ``Recorder`` inherits this class: its state is the recorder's own
attributes, set by ``_init_pending``, so the hot hooks read it with no indirection.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from syncscope.capture.fingerprint import PendingFingerprint
from syncscope.capture.paramprint import PendingParams
from syncscope.capture.recorder.records import Item


class _Buffer(Protocol):
    def buffer(self, item: Item) -> None: ...


class PendingWork:
    """In-flight collectives and pending fingerprints."""

    if TYPE_CHECKING:  # the recorder's, used here
        sink: _Buffer
        _lock: Any
        _clock_offset: int

        def now(self) -> int: ...
        def emit(self, event: dict[str, Any]) -> None: ...

    def _init_pending(self) -> None:
        self._works: list[tuple[int, Any]] = []
        self._pending_fp: list[tuple[int, PendingFingerprint]] = []
        # parameter fingerprints on a device: (their event's first fields, the fingerprints)
        self._pending_pfp: list[tuple[dict[str, Any], PendingParams]] = []

    def _watch(self, work: Any, seq: int) -> None:
        """Remember an in-flight collective; its completion is noticed by ``poll_works``.

        Completion is polled at the rank's next event rather than signalled by a callback on
        the work's future: such callbacks run on the backend's threads and can deadlock with
        process-group teardown. The recorded time is therefore an upper bound (the first
        event after completion), which for DDP's bucket all-reduces is the end of backward.
        """
        with self._lock:
            self._works.append((seq, work))

    def poll_works(self, at: int | None = None) -> None:
        """Hold a ``done`` record, at ``at`` (else now), for each watched collective found
        completed. One pass under the lock (``is_completed`` only reads the work's state);
        the clock is read only when one has completed."""
        if not self._works:
            return
        with self._lock:
            still: list[tuple[int, Any]] | None = None
            for item in self._works:
                try:
                    completed = bool(item[1].is_completed())
                except Exception:
                    completed = True
                if completed:
                    if at is None:
                        at = time.perf_counter_ns() + self._clock_offset  # self.now()
                    self.sink.buffer(("done", item[0], at))
                elif still is None:
                    still = [item]
                else:
                    still.append(item)
            self._works = still or []

    def _resolve_fingerprints(self, wait: bool) -> None:
        keep: list[tuple[int, PendingFingerprint]] = []
        for window, fp in self._pending_fp:
            if wait or fp.ready():
                self.emit({"type": "fp", "window": window, **fp.fields()})
            else:
                keep.append((window, fp))
        self._pending_fp = keep
        if self._pending_pfp:
            later: list[tuple[dict[str, Any], PendingParams]] = []
            for head, pending in self._pending_pfp:
                if wait or pending.ready():
                    self.emit({**head, **pending.fields()})
                else:
                    later.append((head, pending))
            self._pending_pfp = later
