"""pytest plugin (entry point ``pytest11``): the ``syncscope`` fixture and marker.

::

    @pytest.mark.syncscope(max_grad_syncs_per_window=1)
    def test_accumulation_syncs_once(ddp_model):
        train(ddp_model, accum=4, steps=2)

    def test_counts(syncscope, ddp_model):
        train(ddp_model, accum=4, steps=2)
        assert syncscope.grad_syncs_per_window == [1, 1]

The marker tracks the test body (``pytest_runtest_call``: not fixtures' set-up) in this
process and fails the test with the ``assert_syncs`` message when a limit is broken; a test
that fails by itself is reported as it is. Inactive unless a test uses the fixture or the
marker; importing this module does not import torch (the tracker is imported when first
used).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

MARKER = "syncscope"
MARKER_KEYS = (
    "max_grad_syncs_per_window",
    "grad_syncs_per_window",
    "at_micro_batch",
    "allow_errors",
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "syncscope(max_grad_syncs_per_window=None, grad_syncs_per_window=None, "
        "at_micro_batch=None, allow_errors=False): track the test body and fail when gradient "
        "syncs per window break the limit, or on an error finding unless allow_errors",
    )


@pytest.fixture
def syncscope() -> Generator[Any, None, None]:
    """Tracks the test (from this fixture's set-up to its teardown); the value is live
    ``syncscope.Stats``. This process only: nothing is gathered from other ranks."""
    from syncscope.testing.track import track

    with track(gather=False) as stats:
        yield stats


def marker_limits(item: pytest.Item) -> dict[str, Any] | None:
    """The marker's limits, None without a marker; ``pytest.UsageError`` when they are bad."""
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return None
    usage = f"@pytest.mark.syncscope takes keyword arguments {', '.join(MARKER_KEYS)}"
    unknown = sorted(set(marker.kwargs) - set(MARKER_KEYS))
    if marker.args or unknown:
        bad = [repr(a) for a in marker.args] + unknown
        raise pytest.UsageError(f"{usage}; got {', '.join(bad)}")
    limits = {k: v for k, v in marker.kwargs.items() if v is not None}
    if not set(limits) - {"allow_errors"}:
        raise pytest.UsageError(f"{usage}; give at least one limit")
    from syncscope.testing.asserts import validate

    try:
        validate(
            limits.get("grad_syncs_per_window"),
            limits.get("max_grad_syncs_per_window"),
            limits.get("at_micro_batch"),
        )
    except (TypeError, ValueError) as exc:
        raise pytest.UsageError(f"@pytest.mark.syncscope: {exc}") from None
    return limits


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    try:
        limits = marker_limits(item)
        usage = ""
    except pytest.UsageError as exc:
        usage = str(exc)
    if usage:  # failed outside the except: no "During handling of the above exception"
        pytest.fail(usage, pytrace=False)
    if limits is None:
        return (yield)
    from syncscope.testing.asserts import check, explain
    from syncscope.testing.track import track

    expect = {
        "per_window": limits.get("grad_syncs_per_window"),
        "max_per_window": limits.get("max_grad_syncs_per_window"),
        "at_micro_batch": limits.get("at_micro_batch"),
    }
    allow_errors = bool(limits.get("allow_errors", False))
    with track(gather=False) as stats:
        result = yield
    problems = check(stats, **expect, allow_errors=allow_errors)
    if problems:
        pytest.fail(explain(stats, problems, **expect), pytrace=False)
    return result
