"""A run that did not end normally is ``failed``, never clean: the verdict, the run-failed
finding, every renderer, ``diff`` and the test API, on hand-built event streams."""

from __future__ import annotations

import json
from typing import Any

import pytest

from syncscope.analysis.diagnose import diagnose
from syncscope.model import Run, verdict_of
from syncscope.render.diff import compare, render_diff_text
from syncscope.render.outputs import render
from syncscope.testing import assert_syncs
from syncscope.testing.track import Stats
from tests.helpers.events import Rank, run_of

FWD: dict[str, Any] = {"wrapper": "ddp", "module": "ddp:M#0", "sync": True, "depth": 0}


def crashed(rank: int, status: int = 1, reason: str = "RuntimeError: boom") -> Rank:
    """One complete window (synced on every micro-batch), then a crash in the forward of
    micro-batch 2 of window 1."""
    r = Rank(rank).window([0, 1, 2, 3])
    r.micro_batch().micro_batch().add("fwd", **FWD)
    return r.add("exit", status=status, reason=reason, dist_initialized=True)


def kinds(run: Run) -> list[str]:
    return [f.kind for f in diagnose(run)]


def test_every_rank_crashing_is_failed_and_says_where_and_what_was_captured() -> None:
    run = run_of(crashed(0), crashed(1))
    findings = diagnose(run)
    assert verdict_of(findings) == "failed"
    failed = findings[0]
    assert (failed.kind, failed.severity, failed.cause) == ("run-failed", "error", "exit-status")
    assert failed.ranks == (0, 1)
    assert failed.evidence["exit_status"] == 1
    assert failed.evidence["exit_reason"] == "RuntimeError: boom"
    assert failed.evidence["last_seen"] == "in forward of micro-batch 2 of window 1"
    assert failed.evidence["complete_windows"] == 1
    assert failed.evidence["ranks_captured"] == 2
    # said once, by the verdict line or the page's banner, not again in the message
    assert "complete window" not in failed.message
    # the complete window before the crash is still diagnosed
    assert "redundant-sync" in [f.kind for f in findings]


def test_crash_in_backward_and_between_micro_batches() -> None:
    r = Rank(0).window([3])
    r.micro_batch().add("fwd", **FWD).add("fwd_end", depth=0).add("bwd", sync={"ddp:M#0": True})
    r.add("exit", status=1, reason="ValueError: nan", dist_initialized=True)
    (f,) = [f for f in diagnose(run_of(r, world_size=1)) if f.kind == "run-failed"]
    assert f.evidence["last_seen"] == "in backward of micro-batch 1 of window 1"
    r = Rank(0).window([3]).micro_batch()
    r.add("exit", status=2, reason="exit status 2", dist_initialized=True)
    (f,) = [f for f in diagnose(run_of(r, world_size=1)) if f.kind == "run-failed"]
    assert f.evidence["last_seen"] == "after micro-batch 0 of window 1, before its optimizer step"
    assert "exit status 2" in f.message


def test_rank_without_exit_record_is_failed() -> None:
    r0 = Rank(0).window([3]).finish()
    r1 = Rank(1).window([3]).micro_batch()  # killed -9: no exit record
    (f,) = [f for f in diagnose(run_of(r0, r1)) if f.kind == "run-failed"]
    assert (f.cause, f.ranks) == ("no-exit-record", (1,))
    assert "no exit record" in f.message and f.evidence["exit_status"] is None


def test_signal_is_named() -> None:
    r = (
        Rank(0)
        .window([3])
        .add("exit", status=137, reason="killed by signal SIGKILL", dist_initialized=True)
    )
    (f,) = [f for f in diagnose(run_of(r, world_size=1)) if f.kind == "run-failed"]
    assert f.cause == "signal" and "killed by signal SIGKILL" in f.message


def test_one_rank_crashing_names_it_and_is_no_collective_mismatch() -> None:
    # rank 1 crashes; rank 0 goes on into the next micro-batch's all-reduce, then the
    # launcher stops it
    r1 = crashed(1)
    r0 = Rank(0).window([0, 1, 2, 3])
    r0.micro_batch().micro_batch().micro_batch()
    r0.add("exit", status=143, reason="killed by signal SIGTERM", dist_initialized=True)
    findings = diagnose(run_of(r0, r1))
    assert "collective-mismatch" not in [f.kind for f in findings]
    failed = findings[0]
    assert failed.kind == "run-failed" and failed.ranks == (1,)
    assert failed.evidence["first_failed_rank"] == 1
    assert "rank 1 stopped (exit status 1: RuntimeError: boom)" in failed.message
    assert "rank(s) 0 were then stopped by the launcher" in failed.message


def test_mismatch_before_the_crash_is_still_reported() -> None:
    r0 = Rank(0).window([3]).coll("broadcast", 100, phase="other", issuer="user")
    r0.add("exit", status=1, reason="RuntimeError: x", dist_initialized=True)
    r1 = Rank(1).window([3]).coll("broadcast", 200, phase="other", issuer="user").finish()
    assert {"run-failed", "collective-mismatch"} <= set(kinds(run_of(r0, r1)))


def test_normal_exit_everywhere_is_not_failed() -> None:
    # every rank recorded status 0 (a process dying later in shutdown lost nothing)
    run = run_of(Rank(0).window([3]).finish(), Rank(1).window([3]).finish())
    assert kinds(run) == [] and verdict_of(diagnose(run)) == "clean"


def test_hang_is_failed_without_a_second_finding() -> None:
    r0 = (
        Rank(0)
        .window([3])
        .add("exit", status=143, reason="killed by signal SIGTERM", dist_initialized=True)
    )
    r1 = (
        Rank(1)
        .window([3])
        .add("exit", status=143, reason="killed by signal SIGTERM", dist_initialized=True)
    )
    findings = diagnose(run_of(r0, r1, hung=True, hang_timeout_s=5.0))
    assert [f.kind for f in findings] == ["hang"]
    assert verdict_of(findings) == "failed"


def test_reports_say_failed() -> None:
    run = run_of(crashed(0), crashed(1))
    findings = diagnose(run)
    html = render(run, findings, "html")
    assert '<div class="verdict failed" id="verdict">' in html
    assert "The run failed" in html
    assert "Still measured: 1 complete window on 2 ranks" in html
    assert "as it should be" not in html
    assert json.loads(render(run, findings, "json"))["verdict"] == "failed"
    text = " ".join(render(run, findings, "text").split())
    assert "verdict: failed" in text and "still measured: 1 complete window on 2 ranks" in text


def test_diff_with_a_failed_run_claims_no_speed_up() -> None:
    good = run_of(
        Rank(0).window([3]).window([3]).finish(), Rank(1).window([3]).window([3]).finish()
    )
    bad = run_of(crashed(0), crashed(1))
    for a, b, label in ((good, bad, "after"), (bad, good, "before")):
        d = compare(a, diagnose(a), b, diagnose(b))
        assert d.tone == "failed" and d.failed == (label,)
        assert d.speedup is None
        assert d.title.startswith(f"Run {label} failed")
        assert "no speed-up claimed" in d.subtitle
        assert "failed" in render_diff_text(d)


def test_assert_syncs_on_a_failed_run_fails_naming_the_failure() -> None:
    # the one complete window synced once, as expected: the run still failed
    r0 = Rank(0).window([3]).micro_batch()
    r0.add("exit", status=1, reason="RuntimeError: boom", dist_initialized=True)
    r1 = Rank(1).window([3]).micro_batch().finish()
    stats = Stats.from_run(run_of(r0, r1))
    assert stats.verdict == "failed"
    with pytest.raises(AssertionError) as info:
        assert_syncs(stats, per_window=1)
    message = str(info.value)
    assert message.startswith("syncscope: the run failed")
    assert "rank 0 stopped (exit status 1: RuntimeError: boom)" in message


@pytest.mark.parametrize(
    ("reason", "said"),
    [
        (
            "AttributeError: 'Stream' object has no attribute 'record_event'",
            "torch 2.6 cannot run FSDP2 (fully_shard) on CPU ranks (its CPU stream has no "
            "record_event): use torch 2.7 or newer, or CUDA ranks",
        ),
        (
            "RuntimeError: Cannot use ReduceOp.AVG with Gloo",
            "gloo has no ReduceOp.AVG before torch 2.8 (HSDP's replicate all-reduce uses it, as "
            "may a hand all-reduce): use torch 2.8 or newer, or ReduceOp.SUM then a division",
        ),
    ],
)
def test_a_feature_the_release_cannot_run_on_cpu_is_named(reason: str, said: str) -> None:
    # GIVEN: ranks that failed with torch's own error where its release cannot run a feature
    # on CPU ranks (measured on torch 2.6: FSDP2; on 2.7: HSDP and op=AVG over gloo)
    run = run_of(crashed(0, reason=reason), crashed(1, reason=reason))
    # WHEN: the run is diagnosed
    (failed,) = [f for f in diagnose(run) if f.kind == "run-failed"]
    # THEN: the one-line message says what the release lacks, after torch's own line
    assert failed.message.endswith(f"; {said}") and "\n" not in failed.message
    assert reason in failed.message
