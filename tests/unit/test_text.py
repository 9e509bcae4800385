"""Helpers that live in one place and are used from several: each tested once here,
against every caller's expectations."""

from __future__ import annotations

import statistics

import pytest
import torch

from syncscope.analysis.crossrank import collective_mismatch
from syncscope.capture.recorder.core import _op_tensors
from syncscope.load.trace.events import RankEvents
from syncscope.model import SEVERITIES, Finding, input_argument, severity_rank
from syncscope.model.figures import mean, median
from syncscope.render import terminal
from syncscope.text import human_bytes, human_ns
from tests.helpers.events import Rank, run_of

# c10d ops as capture sees them (the dispatched op) and the argument holding what they read
DISPATCHED = {
    "allreduce_": 0,
    "allreduce_coalesced_": 0,
    "broadcast_": 0,
    "reduce_": 0,
    "send": 0,
    "recv_": 0,
    "recv_any_source_": 0,
    "barrier": 0,
    "monitored_barrier_": 0,
    "allgather_": 1,
    "_allgather_base_": 1,
    "allgather_coalesced_": 1,
    "allgather_into_tensor_coalesced_": 1,
    "reduce_scatter_": 1,
    "_reduce_scatter_base_": 1,
    "reduce_scatter_tensor_coalesced_": 1,
    "alltoall_": 1,
    "alltoall_base_": 1,
    "gather_": 1,
    "scatter_": 1,
}


@pytest.mark.parametrize(("op", "index"), DISPATCHED.items())
def test_the_input_argument_is_the_same_for_capture_and_traces(op: str, index: int) -> None:
    # GIVEN one op, as dispatched (capture) and as a trace names it
    assert input_argument(op) == index
    assert input_argument(f"c10d::{op}") == index
    assert input_argument(op.upper()) == index
    # THEN capture reads that argument's tensors...
    first, second = torch.zeros(2), torch.zeros(3, 5)
    assert [t.numel() for t in _op_tensors(op, ([first], [second]))] == [[2], [15]][index]
    # ...and the trace reader that argument's size and dtype
    event = {
        "ph": "X",
        "cat": "cpu_op",
        "name": f"c10d::{op}",
        "ts": 10.0,
        "dur": 2.0,
        "tid": 1,
        "pid": 1,
        "args": {"Input Dims": [[[2]], [[3, 5]]], "Input type": ["float", "c10::Half"]},
    }
    events = RankEvents()
    events([event])
    (raw,) = events.collectives
    assert (raw.nelems, raw.dtype) == [(2, "float"), (15, "c10::Half")][index]


def test_backend_and_spelled_out_names() -> None:
    assert input_argument("nccl:all_reduce") == 0
    assert input_argument("all_to_all") == 1


def test_severity_order_is_most_severe_first() -> None:
    assert SEVERITIES == ("error", "warning", "info")
    assert sorted(["info", "error", "bogus", "warning"], key=severity_rank) == [
        "error",
        "warning",
        "info",
        "bogus",
    ]


@pytest.mark.parametrize("values", [[5], [3, 1], [1, 2, 3], [2, 10**15, 7, 1]])
def test_mean_and_median_match_the_standard_library(values: list[int]) -> None:
    assert mean(values) == statistics.fmean(values)
    assert median(values) == statistics.median(values)
    assert isinstance(median(values), float)


def test_mean_of_nothing_is_zero() -> None:
    assert mean([]) == 0.0
    assert mean(iter([])) == 0.0


def test_human_units_say_not_measured_and_keep_their_forms() -> None:
    assert human_bytes(None) == human_ns(None) == "n/a"
    assert [human_bytes(n) for n in (0, 1023, 1536, 3 << 20)] == [
        "0 B",
        "1023 B",
        "1.5 KiB",
        "3.0 MiB",
    ]
    assert [human_ns(n) for n in (0, 640, 1_500, 12_300_000, 2_500_000_000)] == [
        "0 ns",
        "640 ns",
        "2 µs",
        "12.3 ms",
        "2.50 s",
    ]
    # the terminal's tables and findings show whole microseconds below a millisecond
    assert [terminal.human_ns(n) for n in (0, 640, 1_500, 12_300_000)] == [
        "0 µs",
        "1 µs",
        "2 µs",
        "12.3 ms",
    ]


def _mismatch(findings: list[Finding]) -> Finding:
    (f,) = [f for f in findings if f.kind == "collective-mismatch"]
    return f


def test_live_mismatch_names_the_odd_rank_and_what_each_side_issued() -> None:
    # GIVEN three ranks of one group where rank 2 broadcasts 200 bytes where the others sent 100
    ranks = [
        Rank(r, world_size=3)
        .window([3])
        .coll("broadcast", 100 if r < 2 else 200, phase="other", issuer="user", group=(0, 1, 2))
        .finish()
        for r in range(3)
    ]
    f = _mismatch(collective_mismatch(run_of(*ranks)))
    # THEN the message names rank 0 (the reference) and rank 2, and both collectives; the
    # finding's ranks are every member of the group (all of them would hang), as before
    assert (f.cause, f.ranks, f.windows) == ("size", (0, 1, 2), ())
    assert "rank 0 issued broadcast of 100 bytes" in f.message
    assert "rank(s) 2 issued broadcast of 200 bytes" in f.message
    assert f.evidence["per_rank"] == {
        "0": "broadcast of 100 bytes",
        "1": "broadcast of 100 bytes",
        "2": "broadcast of 200 bytes",
    }
    assert f.fix is not None and f.fix.style == "same-sequence"


def test_point_to_point_differences_are_no_mismatch() -> None:
    r0 = Rank(0).window([3]).coll("send", 64, phase="other", issuer="user").finish()
    r1 = Rank(1).window([3]).coll("recv", 64, phase="other", issuer="user").finish()
    assert collective_mismatch(run_of(r0, r1)) == []
