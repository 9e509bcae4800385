"""The run model's shared definitions: rank sets written one way everywhere (contiguous runs
joined, the count right), the argument each c10d op reads (the same for capture and traces),
the order of severities."""

from __future__ import annotations

import orjson
import pytest
import torch

from syncscope.analysis.coverage import ranks_missing
from syncscope.capture.recorder.core import _op_tensors
from syncscope.load.inputs import load
from syncscope.load.trace.events import RankEvents, decode_events
from syncscope.model import (
    MAX_LISTED_RUNS,
    SEVERITIES,
    compress_ranks,
    input_argument,
    missing_rank_runs,
    missing_ranks_text,
    rank_runs,
    ranks_text,
    severity_rank,
)
from tests.conftest import ROOT
from tests.helpers.events import Rank, run_of

TRACES = ROOT / "sample_traces" / "trace_filter"


def test_runs_gaps_and_single_ranks() -> None:
    # GIVEN ranks with runs, gaps and single ranks, unordered and repeated
    ranks = [9, 0, 1, 2, 5, 7, 8, 2, 12]
    # THEN contiguous runs are joined, singles stand alone
    assert rank_runs(ranks) == [(0, 2), (5, 5), (7, 9), (12, 12)]
    assert compress_ranks(ranks) == "0-2,5,7-9,12"
    assert compress_ranks([4]) == "4"
    assert compress_ranks([]) == ""


def test_missing_ranks_are_written_exactly() -> None:
    # a contiguous range past 64 ranks is one run, not the first 64 and "..."
    assert missing_ranks_text([0, 1], 128) == ("2-127", 126)
    # gaps between present ranks, and a single missing rank at either end
    assert missing_ranks_text([1, 2, 3, 6, 9], 11) == ("0,4-5,7-8,10", 6)
    assert missing_ranks_text(range(8), 8) == ("", 0)
    # a huge world size: the missing run is still exact, and computed from the present ranks
    assert missing_ranks_text([0, 1], 10**12) == (f"2-{10**12 - 1}", 10**12 - 2)


def test_more_runs_than_listed_are_counted_right() -> None:
    # every other rank present: one missing run per present rank, more than are listed
    present = range(0, 4 * MAX_LISTED_RUNS, 2)
    runs, count = missing_rank_runs(present, 4 * MAX_LISTED_RUNS)
    assert len(runs) == MAX_LISTED_RUNS
    assert count == 2 * MAX_LISTED_RUNS
    text = ranks_text(runs, count)
    assert text.startswith("1,3,5,")
    assert text.endswith(f",{2 * MAX_LISTED_RUNS - 1}, ... ({count} ranks)")


def test_ranks_missing_finding_writes_the_range_and_counts_it() -> None:
    run = run_of(Rank(0).micro_batch().step().finish(), world_size=100)
    (finding,) = ranks_missing(run)
    assert "from 99 ranks of 100 (1-99)" in finding.message
    assert finding.evidence["ranks_missing"] == 99


def test_a_trace_set_of_two_ranks_of_128_names_the_other_126_as_one_run() -> None:
    run, _ = load([TRACES], skip_bad=False, progress=False)
    note = next(n for n in run.meta.notes if n.startswith("traces of rank(s)"))
    assert "rank(s) 2-127 were not seen" in note
    (finding,) = ranks_missing(run)
    assert "no trace from 126 ranks of 128 (2-127)" in finding.message


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
    events(decode_events(orjson.dumps([event])))
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
