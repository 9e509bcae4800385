"""A collective mismatch across ranks (``analysis.crossrank``): the odd rank named with what
each side issued; point-to-point differences are no mismatch."""

from __future__ import annotations

from syncscope.analysis.crossrank import collective_mismatch
from syncscope.model import Finding
from tests.helpers.events import Rank, run_of


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
