"""Collectives syncscope issues itself (``track()``'s gather of every rank's events) are not
the job's: no recorder counts them (``syncscope.capture.hooks.collectives.unrecorded``). On two
ranks, with the gather itself: tests/integration/test_track_inside_a_capture.py."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from syncscope import track
from syncscope.capture.hooks import collectives
from syncscope.testing.track import Stats


def _ops(stats: Stats) -> list[str]:
    return [c.op for w in stats.run.ranks[0].windows for c in w.collectives]


@pytest.mark.usefixtures("process_group")
def test_collectives_issued_inside_unrecorded_are_not_recorded() -> None:
    # GIVEN a capture, the job's all_reduce, and a broadcast and an all_gather_object
    # issued as syncscope's own
    with track(gather=False) as stats:
        dist.all_reduce(torch.ones(4))
        with collectives.unrecorded():
            dist.broadcast(torch.ones(2), src=0)
            dist.all_gather_object([None], {"events": []})
        dist.barrier()
    # THEN only the job's collectives are in the run, in their order
    assert _ops(stats) == ["all_reduce", "barrier"]


@pytest.mark.usefixtures("process_group")
def test_unrecorded_nests_and_ends_with_its_block_even_on_an_exception() -> None:
    with track(gather=False) as stats:
        with pytest.raises(KeyError), collectives.unrecorded():
            with collectives.unrecorded():
                dist.all_reduce(torch.ones(1))
            dist.all_reduce(torch.ones(1))  # still inside the outer block
            raise KeyError("boom")
        dist.all_reduce(torch.ones(1))  # the job's again
    assert _ops(stats) == ["all_reduce"]
