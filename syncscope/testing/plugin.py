"""pytest plugin (entry point ``pytest11``): the ``syncscope`` fixture and marker.

::

    @pytest.mark.syncscope(max_grad_syncs_per_window=1)
    def test_accumulation_syncs_once(ddp_model):
        train(ddp_model, accum=4, steps=2)

    def test_counts(syncscope):
        train(ddp_model, accum=4, steps=2)
        assert syncscope.grad_syncs_per_window == [1, 1]

Inactive unless a test uses the fixture or the marker; importing this module does not
import torch (the tracker is imported when first used).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

MARKER = "syncscope"
MARKER_KEYS = ("max_grad_syncs_per_window", "grad_syncs_per_window", "at_micro_batch")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "syncscope(max_grad_syncs_per_window=None, grad_syncs_per_window=None, "
        "at_micro_batch=None): track the test body and fail when gradient syncs per window "
        "break the limit",
    )


@pytest.fixture
def syncscope() -> Generator[Any, None, None]:
    """Tracks the test body; the value is live ``syncscope.Stats``."""
    from syncscope.track import track

    with track(gather=False) as stats:
        yield stats


def _limits(item: pytest.Item) -> dict[str, Any] | None:
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return None
    unknown = set(marker.kwargs) - set(MARKER_KEYS)
    if marker.args or unknown:
        raise pytest.UsageError(
            f"@pytest.mark.syncscope takes keyword arguments {', '.join(MARKER_KEYS)}; "
            f"got {list(marker.args) + sorted(unknown)}"
        )
    return dict(marker.kwargs)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    limits = _limits(item)
    if limits is None:
        return (yield)
    from syncscope.testing.asserts import check, explain
    from syncscope.track import track

    with track(gather=False) as stats:
        result = yield
    problems = check(
        stats,
        per_window=limits.get("grad_syncs_per_window"),
        max_per_window=limits.get("max_grad_syncs_per_window"),
        at_micro_batch=limits.get("at_micro_batch"),
    )
    if problems:
        raise AssertionError(explain(stats, problems))
    return result
