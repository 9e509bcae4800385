"""``RankEvents``: the per-rank arrays a trace's events are read into."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from syncscope.load.trace import events as events_module
from syncscope.load.trace.events import RankEvents, decode_events
from syncscope.load.trace.read import read_trace

NCCL = (
    Path(__file__).resolve().parents[4]
    / "sample_traces"
    / "nccl_parser_config"
    / "nccl_data.json.gz"
)


def _kernel(ts: float, correlation: int, name: str = "ncclDevKernel_AllReduce") -> str:
    return (f'{{"ph": "X", "cat": "kernel", "name": "{name}", "ts": {ts}, "dur": 2.0, '
            f'"args": {{"correlation": {correlation}}}}}')  # fmt: skip


def _op(ts: float, dur: float) -> str:
    return f'{{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": {ts}, "dur": {dur}}}'


def _read(events: RankEvents, *entries: str) -> None:
    events(decode_events(("[" + ", ".join(entries) + "]").encode()))


def test_an_event_too_large_for_64_bits_is_left_out_whole() -> None:
    # GIVEN a kernel whose correlation id, and a CPU op whose duration, do not fit 64 bits,
    # each between two events that do
    events = RankEvents()
    _read(events, _kernel(1.0, 7), _kernel(5.0, 1 << 70), _kernel(9.0, 8))
    _read(events, _op(1.0, 1.0), _op(3.0, 1e20), _op(6.0, 1.0))
    # THEN every array holds whole records: the events after them keep their own times
    assert list(events.comm_kernels) == [1000, 3000, 7, 9000, 11000, 8]
    assert list(events.cpu_compute) == [1000, 2000, 6000, 7000]
    assert events.unplaced == 2


def test_entries_that_are_not_events_are_counted_and_the_rest_read() -> None:
    # GIVEN a piece of the array with an entry that is not an object and an event whose
    # args are not an object (what a typed parse refuses), beside well-formed events
    events = RankEvents()
    _read(events, _op(1.0, 1.0), "[1, 2]", '{"ph": "X", "cat": "kernel", "name": "gemm", '
          '"ts": 3.0, "dur": 1.0, "args": [7]}', _kernel(5.0, 9, name="gemm"))  # fmt: skip
    # THEN the non-object is counted, the well-formed events are read as they would be alone
    assert events.not_objects == 1
    assert list(events.cpu_compute) == [1000, 2000]
    assert list(events.compute_kernels) == [3000, 4000, 5000, 7000]


def test_the_plain_json_path_reads_a_real_trace_as_the_typed_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a real GPU trace, read once as every piece normally is (typed events) and once
    # with every piece sent down the path taken when an entry is not shaped as an event
    typed = RankEvents()
    read_trace(NCCL, typed, decode=decode_events)

    def refuse(piece: bytes) -> list[Any]:
        raise msgspec.ValidationError("as if an entry were not an object")

    monkeypatch.setattr(events_module, "_decode", refuse)
    plain = RankEvents()
    read_trace(NCCL, plain, decode=decode_events)
    # THEN both keep the same records, collectives and counts
    assert typed.events == plain.events > 0
    for name in ("cpu_compute", "backward", "comm_kernels", "compute_kernels", "launch_ids",
                 "launch_times", "collectives", "param_comms", "steps", "forwards"):  # fmt: skip
        assert getattr(typed, name) == getattr(plain, name), name
    assert typed.comm_kernels and typed.param_comms


def test_args_nested_deeper_than_python_recurses_read_as_plain_json_would() -> None:
    # GIVEN a collective whose Input Dims nest 1,000 deep (valid JSON, and past the depth
    # msgspec reaches within Python's recursion limit), beside a plain CPU op
    nested = "[" * 1000 + "]" * 1000
    deep = (f'{{"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "ts": 1.0, '
            f'"dur": 1.0, "tid": 1, "args": {{"Input Dims": {nested}}}}}')  # fmt: skip
    events = RankEvents()
    _read(events, deep, _op(3.0, 1.0))
    # THEN both are read: the collective without a size, the op as any other
    (collective,) = events.collectives
    assert (collective.start, collective.nelems) == (1000, None)
    assert list(events.cpu_compute) == [3000, 4000]
