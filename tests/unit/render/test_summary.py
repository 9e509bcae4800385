"""The report's headline names what was found, never a list of what might have been."""

from __future__ import annotations

import re

from syncscope.model import Finding
from syncscope.render.html import render_html
from tests.helpers import runs


def _kind(kind: str, severity: str = "warning") -> Finding:
    return Finding(kind=kind, severity=severity, cause="c", message=f"{kind} found",
                   ranks=(0, 1), windows=(0,), evidence={}, cost={})  # fmt: skip


def _title(findings: list[Finding]) -> str:
    page = render_html(runs.redundant(), findings)
    found = re.search(r'<div class="verdict [a-z]+" id="verdict"><h1>([^<]*)</h1>', page)
    assert found is not None
    return found.group(1)


def test_communication_only_says_communication() -> None:
    # GIVEN a redundant sync, and nothing about memory
    title = _title([runs.finding()])
    # THEN the headline names communication, and neither memory nor "or"
    assert title == "Training is correct, but wastes communication"


def test_communication_and_memory_are_both_named() -> None:
    title = _title([_kind("redundant-sync"), _kind("unsharded-grad-memory")])
    assert title == "Training is correct, but wastes communication and memory"


def test_an_info_is_not_a_headline() -> None:
    # an info-level memory trade-off beside a warning does not reach the headline
    title = _title([_kind("fragmented-sync"), _kind("unsharded-grad-memory", "info")])
    assert title == "Training is correct, but wastes communication"


def test_other_warnings_say_what_they_are() -> None:
    title = _title([_kind("irregular-window")])
    assert title == "Training is correct, but has windows of unequal length"


def test_errors_name_the_breakage() -> None:
    assert _title([_kind("missing-sync", "error"), _kind("rank-divergence", "error")]) == (
        "Gradient synchronization is broken: ranks diverge"
    )
    assert _title([_kind("grad-reset-mid-window", "error"), _kind("redundant-sync")]) == (
        "Gradient synchronization is broken: gradients are lost mid-window"
    )


def test_no_headline_says_or() -> None:
    kinds = ["redundant-sync", "fragmented-sync", "exposed-communication", "irregular-window",
             "no-process-group", "unsharded-grad-memory"]  # fmt: skip
    for kind in kinds:
        assert " or " not in _title([_kind(kind)])
