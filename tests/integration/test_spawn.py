"""``syncscope.testing.spawn`` on real gloo process groups, and spawn + track() together.

Each test starts real processes (about 2-3 s, mostly importing torch in the children).
"""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback
from pathlib import Path

import pytest

from syncscope.testing import spawn
from tests.helpers import ranks


@pytest.mark.slow
def test_a_rank_failure_is_reraised_with_that_ranks_traceback() -> None:
    # GIVEN rank 1 raises ValueError while rank 0 waits for it in a barrier
    with pytest.raises(ValueError, match="bad batch on rank 1") as info:
        spawn(ranks.fail_on_rank_1, world_size=2, timeout=60)
    # THEN the parent sees rank 1's own exception (not rank 0's broken connection),
    # with rank 1's traceback in the notes
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "raised on rank 1 of 2" in notes
    assert "_rank_one_helper" in notes
    assert "tests/helpers/ranks.py" in notes.replace(os.sep, "/")
    # AND the message is printed once (pytest prints the exception, then its notes)
    printed = "".join(traceback.format_exception(info.value))
    assert printed.count("ValueError: bad batch on rank 1") == 1, printed
    assert not multiprocessing.active_children()


@pytest.mark.slow
def test_a_hung_rank_times_out_and_every_process_is_ended(tmp_path: Path) -> None:
    # GIVEN rank 1 sleeps forever while rank 0 waits for it in a barrier
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"rank\(s\) 0-1 of 2 did not finish within 8 s"):
        spawn(ranks.hang_on_rank_1, world_size=2, args=(str(tmp_path),), timeout=8)
    # THEN it fails within the bound (plus the time to end the processes) ...
    assert time.monotonic() - start < 8 + 10
    # ... and no rank is left running: no child process of ours, and the ranks that got as far
    # as writing their pid (a loaded machine may take the whole timeout to start them) are gone
    assert not multiprocessing.active_children()
    for pid in [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="world_size"):
        spawn(ranks.fail_on_rank_1, world_size=0)
    with pytest.raises(ValueError, match="timeout"):
        spawn(ranks.fail_on_rank_1, timeout=0)


@pytest.mark.slow
def test_track_on_two_ranks_passes_for_no_sync() -> None:
    # GIVEN the correct no_sync loop (pattern 2) tracked on 2 DDP ranks
    summaries = spawn(ranks.track_ddp, world_size=2, args=("no_sync",), timeout=60)
    # THEN the values come back indexed by rank, assert_syncs(per_window=1,
    # at_micro_batch=-1) held on both ranks, and each rank's stats cover every rank
    # (gathered at exit)
    for rank, summary in enumerate(summaries):
        assert summary["rank"] == rank
        assert summary["world_size"] == 2
        assert summary["per_window"] == [1] * ranks.STEPS
        assert summary["ranks_seen"] == [0, 1]
        assert summary["findings"] == []


@pytest.mark.slow
def test_track_on_two_ranks_fails_readably_for_no_sync_around_backward_only() -> None:
    # GIVEN no_sync entered after the forward (pattern 3): DDP still all-reduces every time
    with pytest.raises(AssertionError) as info:
        spawn(ranks.track_ddp, world_size=2, args=("backward_only",), timeout=60)
    message = str(info.value)
    # THEN the message says expected vs actual, where the syncs landed, and the fix
    assert "expected grad syncs per window [1, 1], saw [4, 4]" in message
    assert "window 0: grad syncs on micro-batches [0, 1, 2, 3], expected [3]" in message
    assert (
        "window 1: 4 micro-batches, 4 grad syncs on micro-batches [0, 1, 2, 3]; expected 1 on [3]"
        in message
    )
    assert "finding: warning redundant-sync (no_sync-backward-only)" in message
    assert "fix: Put forward and backward inside no_sync()" in message
    assert "raised on rank" in "\n".join(info.value.__notes__)
