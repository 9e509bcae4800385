"""A trainer's own sync helper that did nothing, named by function and line.

Real 2-rank gloo runs of tests/scripts/sync_helpers.py: a DDP-only ``grad_sync_context``
under FSDP2, a ``no_sync(model)`` helper given a module with DDP inside, and the same
``grad_sync_context`` on DDP, where it works.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parents[1] / "scripts" / "sync_helpers.py"


def _line_of(text: str) -> int:
    return next(i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1) if text in line)


@pytest.mark.parametrize(
    ("pattern", "helper", "with_line", "style", "collective"),
    [
        (
            "grad-sync-context-fsdp2",
            "grad_sync_context",
            "with grad_sync_context(model, is_boundary):",
            "fsdp2",
            "reduce_scatter",
        ),
        (
            "no-sync-outer-module",
            "no_sync",
            "with no_sync(model, enabled=not is_boundary):",
            "ddp-no_sync",
            "all_reduce",
        ),
    ],
)
def test_a_helper_that_changed_no_sync_state_is_named(  # type: ignore[no-untyped-def]
    profiled, pattern, helper, with_line, style, collective
) -> None:
    run = profiled(SCRIPT, pattern)
    for rank in (0, 1):  # measured: every micro-batch reduced, as without the helper
        for w in run.complete_windows(rank):
            assert w["grad_sync_micro_batches"] == [0, 1, 2, 3]
            assert w["collectives"][collective] >= 4
    finding = run.finding("redundant-sync")
    assert (finding["cause"], finding["severity"]) == ("sync-helper-no-op", "warning")
    line = _line_of(with_line)
    (source,) = [s for s in finding["sources"] if s["role"] == "sync_helper"]
    assert (Path(source["file"]), source["line"], source["function"]) == (SCRIPT, line, helper)
    assert finding["evidence"]["sync_helper"] == f"{helper}() at {SCRIPT}:{line}"
    fix = finding["fix"]
    assert fix["style"] == style
    assert f"your helper {helper}() at {SCRIPT}:{line}" in fix["summary"]
    assert "inside no_sync() on every micro-batch" not in fix["summary"]
    assert f"def {helper}(model" in fix["snippet"]


def test_a_helper_that_works_is_clean(profiled) -> None:  # type: ignore[no-untyped-def]
    run = profiled(SCRIPT, "grad-sync-context-ddp")
    for w in run.complete_windows(0):
        assert w["grad_sync_micro_batches"] == [3]
    assert run.report["findings"] == []
    assert run.report["verdict"] == "clean"
