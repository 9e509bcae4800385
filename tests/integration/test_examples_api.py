"""The examples again, through the test API instead of the CLI: ``spawn`` runs each example
on 2 gloo ranks inside ``track()``, and the assertions read like the finding.
"""

from __future__ import annotations

import pytest

from syncscope.testing import spawn
from tests.helpers.ranks import run_example_tracked

pytestmark = pytest.mark.slow  # spawn() starts 2 rank processes per test


def test_no_sync_around_forward_and_backward_syncs_once_on_the_last_micro_batch() -> None:
    for seen in spawn(run_example_tracked, args=("ddp_no_sync.py",), timeout=120):
        assert seen["grad_syncs_per_window"] == [1] * 6  # the example's 6 steps
        assert seen["positions"] == [[3]] * 6
        assert seen["findings"] == []


@pytest.mark.parametrize(
    ("script", "cause"),
    [
        ("ddp_sync_every_step.py", "no-no_sync"),
        ("ddp_no_sync_backward_only.py", "no_sync-backward-only"),
    ],
)
def test_wasteful_examples_sync_every_micro_batch(script: str, cause: str) -> None:
    for seen in spawn(run_example_tracked, args=(script, "--steps", "2"), timeout=120):
        assert seen["grad_syncs_per_window"] == [4, 4]
        assert seen["findings"] == [("redundant-sync", cause)]
