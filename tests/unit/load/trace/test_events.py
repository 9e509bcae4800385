"""``RankEvents``: the per-rank arrays a trace's events are read into."""

from __future__ import annotations

from typing import Any

from syncscope.load.trace.events import RankEvents


def _kernel(ts: float, correlation: int) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": "gemm", "ts": ts, "dur": 2.0,
            "args": {"correlation": correlation}}  # fmt: skip


def _op(ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": ts, "dur": dur}


def test_an_event_too_large_for_64_bits_is_left_out_whole() -> None:
    # GIVEN a kernel whose correlation id, and a CPU op whose duration, do not fit 64 bits,
    # each between two events that do
    events = RankEvents()
    events([_kernel(1.0, 7), _kernel(5.0, 1 << 70), _kernel(9.0, 8)])
    events([_op(1.0, 1.0), _op(3.0, 1e20), _op(6.0, 1.0)])
    # THEN every array holds whole records: the events after them keep their own times
    assert list(events.compute_kernels) == [1000, 3000, 7, 9000, 11000, 8]
    assert list(events.cpu_compute) == [1000, 2000, 6000, 7000]
