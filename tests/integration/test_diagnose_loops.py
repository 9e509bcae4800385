"""Every finding kind from a real 2-rank gloo run, and no finding for correct-but-odd loops.

The loops live in tests/scripts/loops.py; assertions are on what syncscope measured
(counts, positions, fingerprints) and on the finding it derived, never on loop names.
"""

from __future__ import annotations

import pytest

from tests.conftest import LOOPS

pytestmark = pytest.mark.slow  # every test profiles a loop on 2 ranks (shared per session)


def loop(profiled, pattern: str, *options: str):  # type: ignore[no-untyped-def]
    run = profiled(LOOPS, pattern, options=tuple(options))
    assert run.report["ranks"], run.proc.stderr[-2000:]
    return run


@pytest.mark.parametrize(
    "pattern",
    ["flag-before-forward", "forward-only-no_sync", "manual-flat-allreduce"],
)
def test_correct_loops_that_look_wrong_are_clean(profiled, pattern) -> None:  # type: ignore[no-untyped-def]
    run = loop(profiled, pattern)
    assert run.report["findings"] == []
    assert run.report["verdict"] == "clean"
    for rank in (0, 1):
        for w in run.complete_windows(rank):
            assert (w["grad_syncs"], w["grad_sync_micro_batches"]) == (1, [3])
            assert w["fingerprint_match"] is True


def test_flag_set_after_forward_is_a_missing_sync_and_ranks_diverge(profiled) -> None:  # type: ignore[no-untyped-def]
    run = loop(profiled, "flag-after-forward")
    windows = run.complete_windows(0)
    # measured: one sync per window, but on micro-batch 0; the last is never reduced
    assert [w["grad_sync_micro_batches"] for w in windows] == [[0], [0]]
    assert all(w["fingerprint_match"] is False for w in windows)
    missing = run.finding("missing-sync")
    assert missing["cause"] == "flag-after-forward"
    assert missing["severity"] == "error"
    assert missing["fix"]["style"] == "ddp-flag"
    assert {s["role"] for s in missing["sources"]} >= {"forward", "backward", "step"}
    assert run.finding("rank-divergence")["severity"] == "error"
    assert run.report["verdict"] == "errors"
    assert "redundant-sync" not in {k for k, _ in run.kinds()}


def test_step_inside_no_sync_never_syncs(profiled) -> None:  # type: ignore[no-untyped-def]
    run = loop(profiled, "step-inside-no_sync")
    assert all(w["grad_syncs"] == 0 for w in run.complete_windows(0))
    assert ("missing-sync", "step-inside-no_sync") in run.kinds()
    assert ("rank-divergence", "missing-sync") in run.kinds()


@pytest.mark.parametrize(
    ("pattern", "cause"),
    [("zero-grad-each-micro", "optimizer.zero_grad"), ("grad-none-mid-window", "grad=None")],
)
def test_gradients_wiped_mid_window(profiled, pattern, cause) -> None:  # type: ignore[no-untyped-def]
    run = loop(profiled, pattern)
    finding = run.finding("grad-reset-mid-window")
    assert finding["cause"] == cause
    assert finding["severity"] == "error"
    assert finding["cost"]["lost_share_of_gradient"] > 0
    assert all(w["grad_resets"] >= 1 for w in run.complete_windows(0))
    # the sync itself was right: one, on the last micro-batch
    assert all(w["grad_sync_micro_batches"] == [3] for w in run.complete_windows(0))


def test_off_by_one_step_gate_makes_an_irregular_first_window(profiled) -> None:  # type: ignore[no-untyped-def]
    run = loop(profiled, "off-by-one-gate")
    sizes = [w["micro_batches"] for w in run.complete_windows(0)]
    assert sizes == [1, 4, 4]
    finding = run.finding("irregular-window")
    assert (finding["cause"], finding["windows"]) == ("first-window", [0])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("pattern", "tensors"), [("per-param-allreduce", 20), ("per-param-allreduce-mlp3", 6)]
)
def test_one_all_reduce_per_parameter_is_fragmented(profiled, pattern, tensors) -> None:  # type: ignore[no-untyped-def]
    # 6 tensors (a 3-layer MLP) reduced one by one: no count threshold, the measured cost
    run = loop(profiled, pattern)
    w = run.complete_windows(0)[0]
    assert (w["grad_syncs"], w["grad_sync_collectives"]) == (1, tensors)
    finding = run.finding("fragmented-sync")
    assert finding["evidence"]["collectives_per_round"] == tensors
    assert finding["evidence"]["ideal_collectives_per_round"] == 1
    assert finding["evidence"]["mean_bytes"] < 2048
    cost = finding["cost"]
    assert cost["extra_collectives_per_window"] == tensors - 1
    overhead = cost["collective_call_ns"] * cost["extra_collectives_per_window"]
    assert cost["estimated_latency_overhead_ns_per_window"] == pytest.approx(overhead)
    assert cost["share_of_window_time"] == pytest.approx(overhead / cost["window_ns"])
    assert 0.01 <= cost["share_of_window_time"] < 1
    assert finding["severity"] == ("warning" if cost["share_of_window_time"] >= 0.1 else "info")


def test_fsdp_toggle_before_forward_only_still_syncs_every_micro_batch(profiled) -> None:  # type: ignore[no-untyped-def]
    run = loop(profiled, "fsdp2-forward-only-toggle")
    assert all(w["grad_sync_micro_batches"] == [0, 1, 2, 3] for w in run.complete_windows(0))
    finding = run.finding("redundant-sync")
    assert (finding["cause"], finding["severity"]) == ("no_sync-forward-only", "warning")
    assert finding["fix"]["style"] == "fsdp2"


def test_fsdp_sync_never_re_enabled(profiled) -> None:  # type: ignore[no-untyped-def]
    import torch

    run = loop(profiled, "fsdp2-never-reenabled")
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 7):
        # torch 2.6 cannot run FSDP2 on CPU ranks: the job fails in torch, and the run says why
        failed = run.finding("run-failed")
        assert "torch 2.6 cannot run FSDP2 (fully_shard) on CPU ranks" in failed["message"]
        return
    assert all(w["collectives"]["reduce_scatter"] == 0 for w in run.complete_windows(0))
    assert ("missing-sync", "fsdp-sync-never-re-enabled") in run.kinds()


def test_fsdp_sharded_accumulation_is_a_quantified_trade_off(profiled) -> None:  # type: ignore[no-untyped-def]
    from tests.conftest import EXAMPLES

    run = profiled(EXAMPLES / "fsdp2_no_toggle.py", "--steps", "2")
    finding = run.finding("redundant-sync")
    assert (finding["cause"], finding["severity"]) == ("fsdp-sharded-accumulation", "info")
    assert finding["cost"]["wasted_bytes_per_window"] > 0
    assert finding["cost"]["extra_memory_bytes_if_skipped"] > 0
    assert run.report["verdict"] == "clean"


def test_fsdp_toggle_reports_unsharded_memory(profiled) -> None:  # type: ignore[no-untyped-def]
    from tests.conftest import EXAMPLES

    run = profiled(EXAMPLES / "fsdp2_toggle.py", "--steps", "2")
    finding = run.finding("unsharded-grad-memory")
    assert finding["severity"] == "info"
    assert finding["cost"]["estimated_extra_memory_bytes"] > 0


def test_redundant_sync_causes_from_examples(profiled) -> None:  # type: ignore[no-untyped-def]
    from tests.conftest import EXAMPLES

    every = profiled(EXAMPLES / "ddp_sync_every_step.py", "--steps", "2").finding("redundant-sync")
    assert (every["cause"], every["severity"]) == ("no-no_sync", "warning")
    backward_only = profiled(EXAMPLES / "ddp_no_sync_backward_only.py", "--steps", "2")
    finding = backward_only.finding("redundant-sync")
    assert finding["cause"] == "no_sync-backward-only"
    assert finding["evidence"]["grad_sync_micro_batches"] == [0, 1, 2, 3]
    assert (
        finding["cost"]["wasted_bytes_per_window"]
        == 3 * backward_only.complete_windows(0)[0]["grad_sync_bytes"] // 4
    )
    assert 0 < finding["cost"]["share_of_window_time"] <= 1
    # 2 steps: 1 steady window, so no projection, on the card as in the summary
    assert "projected_window_ns" not in finding["cost"]
    assert finding["cost"]["projection_omitted"].startswith("too few steady windows")
    assert {s["role"] for s in finding["sources"]} >= {"forward", "backward", "no_sync", "step"}
    assert finding["fix"]["style"] == "ddp-no_sync"


def test_mismatched_collectives_hang_is_reported_and_bounded(profiled) -> None:  # type: ignore[no-untyped-def]
    run = loop(profiled, "mismatch-hang", "--hang-timeout", "3")
    assert run.proc.returncode != 0
    assert run.report["hung"] is True
    hang = run.finding("hang")  # the mismatch behind it is on its card
    assert "rank(s) 1 issued all_reduce" in hang["evidence"]["collective_mismatch"]
    per_rank = hang["evidence"]["per_rank"]
    assert per_rank["0"]["blocked_in"].startswith("barrier")
    assert per_rank["1"]["blocked_in"].startswith("all_reduce")
    assert "all_reduce" in per_rank["0"]["last_completed"]
    # what happened before the hang is still there
    assert [w["grad_syncs"] for w in run.complete_windows(0)] == [4, 4]


def test_accelerate_sync_each_batch_is_reported_as_deliberate(profiled) -> None:  # type: ignore[no-untyped-def]
    run = loop(profiled, "accelerate-sync-each-batch")
    # accumulation still happens (one real step per 4 micro-batches), syncing every one
    assert [(w["micro_batches"], w["grad_syncs"]) for w in run.complete_windows(0)] == [
        (4, 4),
        (4, 4),
    ]
    finding = run.finding("redundant-sync")
    assert (finding["cause"], finding["severity"]) == ("sync-each-batch", "info")
    assert finding["cost"]["wasted_bytes_per_window"] > 0
    assert run.report["verdict"] == "clean"
