"""Rank sets are written one way everywhere: contiguous runs joined, the count right."""

from __future__ import annotations

from syncscope.analysis.coverage import ranks_missing
from syncscope.load.inputs import load
from syncscope.model import (
    MAX_LISTED_RUNS,
    compress_ranks,
    missing_rank_runs,
    missing_ranks_text,
    rank_runs,
    ranks_text,
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
