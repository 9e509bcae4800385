"""``assert_syncs`` messages, from hand-built runs (no processes): expected vs actual per
window, where the syncs landed, and the finding with its fix."""

from __future__ import annotations

import pytest

from syncscope.model import Run
from syncscope.testing import assert_syncs
from syncscope.testing.track import Stats
from tests.helpers import runs


def failure(stats: Stats, **expect: object) -> str:
    with pytest.raises(AssertionError) as info:
        assert_syncs(stats, **expect)  # type: ignore[arg-type]
    return str(info.value)


def stats_of(run: Run, rank: int = 0) -> Stats:
    return Stats.from_run(run, rank=rank)


def test_clean_run_passes_every_form_of_expectation() -> None:
    stats = stats_of(runs.clean_ddp())
    assert_syncs(stats, per_window=1)
    assert_syncs(stats, per_window=[1, 1, 1, 1])
    assert_syncs(stats, max_per_window=1)
    assert_syncs(stats, at_micro_batch=-1)
    assert_syncs(stats, at_micro_batch=3)
    assert_syncs(stats, at_micro_batch=[3])
    assert_syncs(stats, per_window=1, max_per_window=1, at_micro_batch=-1)
    with pytest.raises(TypeError, match="needs an expectation"):
        assert_syncs(stats)  # no expectation: an error, not a silent pass


def test_redundant_run_message_has_expected_vs_actual_positions_finding_and_fix() -> None:
    # GIVEN every micro-batch all-reduces (pattern 1)
    message = failure(stats_of(runs.redundant()), per_window=1, at_micro_batch=-1)
    lines = message.splitlines()
    # THEN the head says what broke ...
    assert lines[0] == "syncscope: gradient syncs are not as expected"
    assert lines[1] == "  expected grad syncs per window [1, 1, 1, 1], saw [4, 4, 4, 4]"
    assert lines[2] == "  window 0: grad syncs on micro-batches [0, 1, 2, 3], expected [3]"
    # ... every window shows actual vs expected and where the syncs landed ...
    assert lines[3] == "windows (rank 0, micro-batches counted from 0):"
    for i in range(4):
        assert lines[4 + i] == (
            f"  window {i}: 4 micro-batches, 4 grad syncs on micro-batches [0, 1, 2, 3]; "
            "expected 1 on [3]"
        )
    # ... and the diagnosis with its source lines and fix snippet
    assert lines[8].startswith(
        "finding: warning redundant-sync (reduced-unarmed): gradients reduced"
    )
    assert "  forward: train.py:42" in lines
    assert any(
        # the summary as text, its markdown marks stripped
        line.startswith("  fix: Put forward and backward inside no_sync()")
        for line in lines
    )
    assert "        with model.no_sync() if not is_last else contextlib.nullcontext():" in lines


def test_max_per_window_names_the_windows_over_the_limit() -> None:
    message = failure(stats_of(runs.redundant()), max_per_window=2)
    assert (
        "  expected at most 2 grad sync(s) per window, saw [4, 4, 4, 4] "
        "(over the limit: window(s) [0, 1, 2, 3])"
    ) in message.splitlines()
    assert "; expected at most 2" in message


def test_misplaced_sync_on_one_rank_is_reported_from_that_rank() -> None:
    # GIVEN rank 1 syncs on micro-batch 0 instead of the last (pattern 7)
    stats = stats_of(runs.divergent(), rank=1)
    assert_syncs(stats, per_window=1, allow_errors=True)  # the count alone looks right
    assert "error finding missing-sync" in failure(stats, per_window=1)  # the run does not
    message = failure(stats, per_window=1, at_micro_batch=-1)
    assert "  window 0: grad syncs on micro-batches [0], expected [3]" in message
    assert "windows (rank 1, micro-batches counted from 0):" in message
    assert (
        "  window 2: 4 micro-batches, 1 grad sync on micro-batches [0]; expected 1 on [3]"
        in message
    )
    assert "finding: error missing-sync (misplaced-sync)" in message
    # rank 0's own counts were fine (the run's error is allowed here)
    rank0 = stats_of(runs.divergent(), rank=0)
    assert_syncs(rank0, per_window=1, at_micro_batch=-1, allow_errors=True)


def test_exact_list_of_counts() -> None:
    stats = stats_of(runs.make_run(sync_at=lambda r, w, m, n: m == n - 1 or w == 0))
    assert_syncs(stats, per_window=[4, 1, 1, 1])
    message = failure(stats, per_window=[1, 1, 1, 1])
    assert "expected grad syncs per window [1, 1, 1, 1], saw [4, 1, 1, 1]" in message
    assert (
        "  window 0: 4 micro-batches, 4 grad syncs on micro-batches [0, 1, 2, 3]; expected 1"
        in message
    )


def test_no_complete_window_fails_instead_of_passing_vacuously() -> None:
    stats = stats_of(runs.make_run(windows=0))
    message = failure(stats, max_per_window=1)
    assert "no complete window was recorded" in message


def test_long_runs_are_cut_after_twelve_windows() -> None:
    message = failure(
        stats_of(runs.make_run(ranks=1, windows=20, sync_at=runs.every)), per_window=1
    )
    shown = [line for line in message.splitlines() if " micro-batches, " in line]
    assert len(shown) == 12
    assert shown[-1].startswith("  window 11: 4 micro-batches")
    assert "  ... 8 more windows" in message


@pytest.mark.parametrize(
    ("expect", "error"),
    [
        ({"per_window": "1"}, TypeError),
        ({"per_window": [1, "1"]}, TypeError),
        ({"max_per_window": 1.5}, TypeError),
        ({"max_per_window": True}, TypeError),
        ({"at_micro_batch": None, "per_window": -1}, ValueError),
        ({"max_per_window": -1}, ValueError),
    ],
)
def test_bad_arguments_raise_type_or_value_errors(expect: dict[str, object], error: type) -> None:
    with pytest.raises(error):
        assert_syncs(stats_of(runs.clean_ddp()), **expect)  # type: ignore[arg-type]


def test_an_error_finding_fails_right_counts_unless_allowed() -> None:
    # GIVEN: a run whose counts are right (1 per window, on the last micro-batch) but whose
    # diagnosis has an error (gradients reset mid-window: verdict `errors`)
    stats = stats_of(runs.clean_ddp())
    stats._findings = [runs.finding("grad-reset-mid-window", "error", cause="zero_grad")]
    assert stats.verdict == "errors"
    # WHEN / THEN: the assertion fails on the error, naming it and the opt-out
    message = failure(stats, per_window=1, at_micro_batch=-1)
    assert "error finding grad-reset-mid-window" in message
    assert "allow_errors=True" in message
    # AND passes when the user opts out; a warning never fails it
    assert_syncs(stats, per_window=1, at_micro_batch=-1, allow_errors=True)
    stats._findings = [runs.finding("redundant-sync", "warning")]
    assert_syncs(stats, per_window=1, at_micro_batch=-1)
