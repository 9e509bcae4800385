"""What the framework callbacks share (``syncscope.integrations._tracker.SyncTracker``),
driven by hand around a DDP loop of world size 1: the framework's start and end hooks call
``begin()`` and ``end()``, Lightning's ``on_exception`` calls ``close()``."""

from __future__ import annotations

import pytest

from syncscope.capture.hooks import collectives
from syncscope.integrations._tracker import LightningHooks, SyncTracker
from syncscope.testing import assert_syncs
from tests.helpers.ranks import make_ddp, train


def test_bad_limits_fail_when_the_callback_is_built() -> None:
    with pytest.raises(TypeError, match="max_per_window must be an int"):
        SyncTracker(max_grad_syncs_per_window="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="at_micro_batch"):
        SyncTracker(at_micro_batch=[1.5])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="negative"):
        SyncTracker(grad_syncs_per_window=-1)


def test_stats_before_any_training_say_so() -> None:
    with pytest.raises(RuntimeError, match="no training has started with this callback"):
        SyncTracker().stats  # noqa: B018


@pytest.mark.usefixtures("process_group")
def test_counts_between_begin_and_end_and_passes_within_the_limits() -> None:
    tracker = SyncTracker(max_grad_syncs_per_window=1, grad_syncs_per_window=1, at_micro_batch=-1)
    model = make_ddp()
    tracker.begin()
    assert tracker.tracking
    train(model, mode="no_sync")
    assert tracker.stats.grad_syncs_per_window == [1, 1]  # live
    tracker.end()
    assert not tracker.tracking
    assert tracker.stats.grad_syncs_per_window == [1, 1]
    assert tracker.stats.verdict == "clean"
    assert collectives._library is None  # no recorder left: the c10d kernels are unregistered
    tracker.end()  # a second end (no begin) does nothing


@pytest.mark.usefixtures("process_group")
def test_over_the_limit_raises_the_assert_syncs_message() -> None:
    tracker = LightningHooks(max_grad_syncs_per_window=1)
    model = make_ddp()
    tracker.on_fit_start(None, None)
    train(model, mode="every")
    with pytest.raises(AssertionError) as info:
        tracker.on_fit_end(None, None)
    # the message is assert_syncs's, word for word
    with pytest.raises(AssertionError) as direct:
        assert_syncs(tracker.stats, max_per_window=1)
    assert str(info.value) == str(direct.value)
    assert "expected at most 1 grad sync(s) per window, saw [4, 4]" in str(info.value)
    assert "finding: warning redundant-sync (no-no_sync)" in str(info.value)
    # Lightning then reports that exception to on_exception: nothing left to end
    tracker.on_exception(None, None, info.value)
    assert tracker.stats.verdict == "warnings"


@pytest.mark.usefixtures("process_group")
def test_an_exception_ends_tracking_as_failed_and_a_stale_run_is_closed_on_begin() -> None:
    model = make_ddp()
    lightning = LightningHooks(max_grad_syncs_per_window=0)
    lightning.on_fit_start(None, None)
    train(model, steps=1)
    lightning.on_exception(None, None, KeyError("boom"))
    # hooks removed, nothing checked (the limit of 0 would have failed), the run failed
    assert collectives._library is None  # no recorder left: the c10d kernels are unregistered
    assert lightning.stats.verdict == "failed"
    assert lightning.stats.grad_syncs_per_window == [1]

    # the HF Trainer has no exception event: a train() that raised leaves tracking open ...
    tracker = SyncTracker(max_grad_syncs_per_window=1)
    tracker.begin()
    train(model, steps=1)
    stale = tracker.stats
    # ... until the next begin() closes it as failed and starts afresh
    tracker.begin()
    assert stale.verdict == "failed"
    assert stale.run.ranks[0].exit_reason == "exception"
    train(model, steps=2)
    tracker.end()
    assert tracker.stats.grad_syncs_per_window == [1, 1]
    # close() with nothing open does nothing
    tracker.close()
    assert tracker.stats.verdict == "clean"


def test_an_error_finding_fails_the_callback_unless_allowed() -> None:
    import contextlib

    from syncscope.testing.track import Stats
    from tests.helpers import runs

    def ended(**kwargs: object) -> SyncTracker:
        tracker = SyncTracker(grad_syncs_per_window=1, **kwargs)  # type: ignore[arg-type]
        stats = Stats.from_run(runs.clean_ddp(), rank=0)  # counts right: 1 per window
        stats._findings = [runs.finding("grad-reset-mid-window", "error", cause="zero_grad")]
        tracker._stats, tracker._tracking = stats, contextlib.nullcontext(stats)
        tracker.end()
        return tracker

    with pytest.raises(AssertionError, match="error finding grad-reset-mid-window"):
        ended()
    assert ended(allow_errors=True).allow_errors
