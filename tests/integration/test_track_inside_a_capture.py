"""``track()`` inside another capture, on two gloo ranks: the inner ``track()`` gathers every
rank's events with collectives of its own at exit, and the capture around it (here an outer
``track()``, in a job an ``syncscope profile`` session) does not count them as the job's."""

from __future__ import annotations

from typing import Any

import pytest

from syncscope.testing import spawn
from tests.helpers import ranks


def nested_track() -> dict[str, Any]:
    """Run by spawn on every rank: a DDP loop tracked twice, the inner track() gathering."""
    from syncscope import track

    model = ranks.make_ddp()
    with track(gather=False) as outer, track() as inner:
        ranks.train(model, steps=2, mode="no_sync")
    rank = outer.rank

    def ops(stats: Any) -> list[tuple[str, str]]:
        run_rank = next(r for r in stats.run.ranks if r.rank == rank)
        return [(c.op, c.issuer) for w in run_rank.windows for c in w.collectives]

    return {
        "inner_ranks": sorted(r.rank for r in inner.run.ranks),
        "inner_ops": ops(inner),
        "outer_ops": ops(outer),
        "outer_per_window": outer.grad_syncs_per_window,
    }


@pytest.mark.slow
def test_a_capture_around_track_does_not_count_tracks_gather() -> None:
    # GIVEN track() (gathering) inside an outer track() on 2 DDP ranks
    results = spawn(nested_track, world_size=2, timeout=90)
    for result in results:
        # THEN the inner track() gathered both ranks' events (its own collectives ran) ...
        assert result["inner_ranks"] == [0, 1]
        # ... and the outer capture saw exactly the job's collectives, the ones the inner
        # one saw, and no all_gather of the gather after them
        assert result["outer_ops"] == result["inner_ops"]
        assert result["outer_ops"]
        assert all(op != "all_gather" for op, _ in result["outer_ops"])
        assert result["outer_per_window"] == [1, 1]
