"""Diagnoses on hand-built runs: each rule against the principle, wrapper by wrapper."""

from __future__ import annotations

from syncscope.analysis.diagnose import diagnose
from syncscope.model import Finding, compress_ranks, verdict_of
from tests.unit.events import Rank, run_of


def kinds(findings: list[Finding]) -> set[tuple[str, str, str]]:
    return {(f.kind, f.cause, f.severity) for f in findings}


def both(build) -> list[Finding]:  # type: ignore[no-untyped-def]
    return diagnose(run_of(build(Rank(0)), build(Rank(1))))


def test_one_sync_on_the_last_micro_batch_is_clean() -> None:
    findings = both(lambda r: r.window([3]).window([3]).finish())
    assert findings == []
    assert verdict_of(findings) == "clean"


def test_given_no_no_sync_when_every_micro_batch_syncs_then_redundant() -> None:
    findings = both(lambda r: r.window([0, 1, 2, 3]).window([0, 1, 2, 3]).finish())
    (f,) = findings
    assert (f.kind, f.cause, f.severity) == ("redundant-sync", "no-no_sync", "warning")
    assert f.ranks == (0, 1) and f.windows == (0, 1)
    assert f.cost["wasted_bytes_per_window"] == 3 * 4096
    assert f.evidence["grad_sync_micro_batches"] == [0, 1, 2, 3]
    assert f.fix is not None and f.fix.style == "ddp-no_sync"


def test_fsdp1_no_sync_around_forward_only_still_syncs() -> None:
    # FSDP1 needs a GPU: FSDP decides at backward, so a forward-only no_sync does nothing
    def build(r: Rank) -> Rank:
        r = Rank(r.rank, wrappers=("fsdp",))
        for _ in range(2):
            for _ in range(4):
                r.micro_batch(
                    wrapper="fsdp",
                    fwd_sync=False,
                    bwd_sync=True,
                    op="reduce_scatter",
                    labels=("fsdp:M#0",),
                )
            r.add("toggle", how="no_sync", value=False, module="fsdp:M#0")
            r.step(fp=None, sharded=True)
        return r.finish()

    assert kinds(both(build)) == {("redundant-sync", "no_sync-forward-only", "warning")}


def test_fsdp_skip_then_sync_holds_unsharded_gradients() -> None:
    def build(r: Rank) -> Rank:
        r = Rank(r.rank, wrappers=("fsdp",))
        r.add("toggle", how="set_requires_gradient_sync", value=False, module="fsdp:M#0")
        for i in range(4):
            r.micro_batch(
                wrapper="fsdp",
                fwd_sync=i == 3,
                bwd_sync=i == 3,
                syncs=int(i == 3),
                op="reduce_scatter",
                labels=("fsdp:M#0",),
            )
        return r.step(sharded=True).finish()

    (f,) = both(build)
    assert (f.kind, f.severity) == ("unsharded-grad-memory", "info")
    assert f.cost["estimated_extra_memory_bytes"] == 2048  # half of 4 KiB at shard world 2


def test_inner_wrapper_not_covered_by_the_outer_no_sync() -> None:
    def build(r: Rank) -> Rank:
        r = Rank(r.rank, wrappers=("ddp", "ddp"))
        for _ in range(4):
            r.micro_batch(fwd_sync=False, bwd_sync=False, labels=("ddp:M#0", "ddp:M#1"))
        return r.step().finish()

    assert ("redundant-sync", "inner-wrapper", "warning") in kinds(both(build))


def test_accelerate_sync_each_batch_is_deliberate() -> None:
    accel = {"sync_each_batch": True, "sync_gradients": True}
    findings = both(lambda r: r.window([0, 1, 2, 3], accelerate=accel).finish())
    (f,) = findings
    assert (f.cause, f.severity) == ("sync-each-batch", "info")
    assert f.fix is not None and f.fix.style == "sync-each-batch"
    assert verdict_of(findings) == "clean"


def test_no_sync_at_all_is_missing_and_diverges() -> None:
    def build(r: Rank) -> Rank:
        for _ in range(2):
            for _ in range(4):
                r.micro_batch(fwd_sync=False, bwd_sync=False, syncs=0)
            r.step(fp=(1.0 + r.rank, 2.0))
        return r.finish()

    found = kinds(both(build))
    assert ("rank-divergence", "missing-sync", "error") in found
    assert any(k == "missing-sync" for k, _, _ in found)


def test_divergence_without_a_missing_sync_has_unknown_cause() -> None:
    findings = diagnose(
        run_of(
            Rank(0).window([3]).finish(),
            Rank(1)
            .micro_batch(syncs=0)
            .micro_batch(syncs=0)
            .micro_batch(syncs=0)
            .micro_batch(syncs=1)
            .step(fp=(5.0, 6.0))
            .finish(),
        )
    )
    (f,) = [f for f in findings if f.kind == "rank-divergence"]
    assert f.cause == "unknown" and f.windows == (0,)


def test_irregular_window_at_epoch_end() -> None:
    def build(r: Rank) -> Rank:
        return r.window([3]).window([1], n=2).window([3]).window([3]).finish()

    (f,) = both(build)
    assert (f.kind, f.cause, f.windows) == ("irregular-window", "uneven-window", (1,))


def test_trailing_incomplete_window_is_not_irregular() -> None:
    def build(r: Rank) -> Rank:
        return r.window([3]).window([3]).micro_batch(syncs=0).finish()

    assert both(build) == []
    run = run_of(build(Rank(0)), build(Rank(1)))
    assert [w.complete for w in run.ranks[0].windows] == [True, True, False]


def test_fragmented_threshold() -> None:
    def build(count: int):  # type: ignore[no-untyped-def]
        def make(r: Rank) -> Rank:
            r = Rank(r.rank, wrappers=())
            for _ in range(4):
                r.add("bwd", sync={})
                r.add("bwd_end")
            for _ in range(count):
                r.coll(nbytes=512, phase="after-backward", issuer="user", grad_storage=True)
            return r.step().finish()

        return make

    assert both(build(15)) == []
    (f,) = both(build(16))
    assert (f.kind, f.evidence["collectives_per_round"], f.evidence["mean_bytes"]) == (
        "fragmented-sync",
        16,
        512,
    )


def test_collective_mismatch_by_size() -> None:
    r0 = Rank(0).window([3]).coll("broadcast", 100, phase="other", issuer="user").finish()
    r1 = Rank(1).window([3]).coll("broadcast", 200, phase="other", issuer="user").finish()
    (f,) = [f for f in diagnose(run_of(r0, r1)) if f.kind == "collective-mismatch"]
    assert f.cause == "size"
    assert f.evidence["per_rank"] == {"0": "broadcast of 100 bytes", "1": "broadcast of 200 bytes"}


def test_collectives_of_other_groups_are_matched_separately() -> None:
    # ranks 0,1 share group (0,1); rank 0 also talks in group (0,2) that rank 2 never ran here
    r0 = Rank(0, world_size=3).window([3]).coll(group=(0, 2), phase="other", issuer="user").finish()
    r1 = Rank(1, world_size=3).window([3]).finish()
    findings = diagnose(run_of(r0, r1, world_size=3))
    assert not [f for f in findings if f.kind == "collective-mismatch"]


def test_single_process_without_distributed_has_no_sync_findings() -> None:
    r = Rank(0, world_size=1, wrappers=())
    r.events = [e for e in r.events if e["type"] != "dist"]
    for _ in range(3):
        r.add("bwd", sync={})
        r.add("bwd_end")
    r.step().add("exit", status=0, reason="finished", dist_initialized=False)
    run = run_of(r, world_size=1)
    assert diagnose(run) == []
    assert any("never initialised" in n for n in run.meta.notes)


def test_hang_reports_last_completed_and_blocked_in() -> None:
    r0 = Rank(0).window([3])
    r0.add(
        "coll",
        seq=99,
        t_end=r0.t,
        op="barrier",
        raw="barrier",
        bytes=0,
        dtype="",
        pg="0",
        group=[0, 1],
        phase="other",
        issuer="user",
    )
    r1 = Rank(1).window([3])
    run = run_of(r0, r1, hung=True, hang_timeout_s=5.0)
    (f,) = [f for f in diagnose(run) if f.kind == "hang"]
    per_rank = f.evidence["per_rank"]
    assert isinstance(per_rank, dict)
    assert per_rank["0"]["blocked_in"].startswith("barrier #99")
    assert per_rank["1"]["blocked_in"] == "no collective in flight"
    assert "all_reduce" in per_rank["1"]["last_completed"]
    assert any("without an exit record" in n for n in run.meta.notes)


def test_cuda_peak_memory_wins_over_rss() -> None:
    r = Rank(0).micro_batch().step(cuda_peak=123456789).finish()
    run = run_of(r, world_size=1)
    assert run.ranks[0].windows[0].peak_memory_bytes == 123456789
    assert run.ranks[0].device == "cuda"


def test_compress_ranks() -> None:
    assert compress_ranks([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert compress_ranks(list(range(1024))) == "0-1023"
    assert compress_ranks([]) == ""
