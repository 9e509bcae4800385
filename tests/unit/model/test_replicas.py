"""Local SGD read from the run (syncscope.model.replicas): gradients reduced inside subgroups
and parameters averaged over the world every few steps. Replicas are compared inside each
subgroup; a divergence inside one is still an error; subgroup reductions that are never
averaged are no local SGD. Hand-built 4-rank event streams."""

from __future__ import annotations

from syncscope.analysis.diagnose import diagnose
from tests.helpers.events import Rank, run_of

WORLD = (0, 1, 2, 3)


def _rank(rank: int, averaged: bool = True, noisy: bool = False) -> Rank:
    """6 windows of 2 micro-batches: the first two reduce over the world, the rest inside
    the rank's pair; an averaging all-reduce of the parameters after every second step."""
    group = (0, 1) if rank < 2 else (2, 3)
    r = Rank(rank, world_size=4)
    for w in range(6):
        local = w >= 2
        if averaged and local and w % 2 == 1:
            r.coll(nbytes=4096, phase="other", issuer="user", group=WORLD)
        r.micro_batch(fwd_sync=False, bwd_sync=False, syncs=0)
        r.add("fwd", wrapper="ddp", module="ddp:M#0", sync=True, depth=0, site=None)
        r.add("bwd", sync={"ddp:M#0": True}, site=None)
        r.coll(nbytes=4096, group=group if local else WORLD)  # the hook's bucket
        r.add("bwd_end")
        fp = float(w) if not local else float(w * 10 + group[0])  # equal inside the pair
        if noisy and rank == 1:
            fp += 0.5
        r.step(fp=(fp,))
    return r.finish()


def _findings(**kw: bool) -> list[tuple[str, str, str]]:
    run = run_of(*(_rank(r, **kw) for r in WORLD))
    return [(f.kind, f.cause, f.severity) for f in diagnose(run)]


def test_local_sgd_is_info_with_replicas_compared_inside_subgroups() -> None:
    assert _findings() == [("local-sgd", "subgroup-reduction", "info")]


def test_a_divergence_inside_a_subgroup_is_still_an_error() -> None:
    found = _findings(noisy=True)
    assert any(kind == "rank-divergence" and sev == "error" for kind, _, sev in found)
    assert ("local-sgd", "subgroup-reduction", "info") in found


def test_subgroup_reductions_never_averaged_are_divergence() -> None:
    found = _findings(averaged=False)
    assert any(kind == "rank-divergence" and sev == "error" for kind, _, sev in found)
    assert not any(kind == "local-sgd" for kind, _, _ in found)
