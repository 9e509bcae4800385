"""Fixture pairs: every rewrite and every leave-alone case, compared exactly; idempotence."""

from __future__ import annotations

from pathlib import Path

import pytest

from syncscope.fixes import FixOptions, fix_source

FIXTURES = Path(__file__).parent.parent / "fixtures" / "fix"
PAIRS = sorted(FIXTURES.glob("*.in.py"))
LEAVE_ALONE = {
    "accelerate_accumulate",
    "ddp_no_sync_correct",
    "ddp_no_sync_forward_only",
    "fsdp2_toggle",
    "nanogpt_flag_before_forward",
    "single_process",
    "unresolved_wrapper",
}


def _name(path: Path) -> str:
    return path.name.removesuffix(".in.py")


@pytest.mark.parametrize("source", PAIRS, ids=_name)
def test_fixture_pair(source: Path) -> None:
    # GIVEN a loop as people write it WHEN fixed THEN the result is the .out.py file exactly
    expected = source.with_name(_name(source) + ".out.py").read_text()
    result = fix_source(source.read_text(), path=source.name)
    assert result.fixed == expected
    assert result.changed == (_name(source) not in LEAVE_ALONE)


@pytest.mark.parametrize("source", PAIRS, ids=_name)
def test_fix_is_idempotent(source: Path) -> None:
    once = fix_source(source.read_text()).fixed
    again = fix_source(once)
    assert again.fixed == once
    assert all(p.code == "SYN100" for p in again.problems)


def test_leave_alone_cases_report_nothing() -> None:
    for name in LEAVE_ALONE - {"unresolved_wrapper"}:
        result = fix_source((FIXTURES / f"{name}.in.py").read_text())
        assert result.problems == (), name


def test_unresolved_wrapper_is_said_not_rewritten() -> None:
    result = fix_source((FIXTURES / "unresolved_wrapper.in.py").read_text())
    (problem,) = result.problems
    assert problem.code == "SYN100" and not problem.fixed
    assert "not wrapped in this file" in problem.message
    assert "--style" in problem.suggestion and "--from" in problem.suggestion


def test_style_names_the_wrapper_when_unresolved() -> None:
    source = (FIXTURES / "unresolved_wrapper.in.py").read_text()
    result = fix_source(source, FixOptions(style="flag"))
    assert "model.require_backward_grad_sync = is_last\n" in result.fixed
    assert [p.code for p in result.problems] == ["SYN101"]


@pytest.mark.parametrize(
    ("name", "codes"),
    [
        ("ddp_no_suppression_modulo", ["SYN101"]),
        ("ddp_no_sync_backward_only", ["SYN102"]),
        ("fsdp2_forward_only", ["SYN103"]),
        ("ddp_flag_after_forward", ["SYN104"]),
        ("fsdp2_never_enabled", ["SYN105"]),
        ("zero_grad_every_micro_batch", ["SYN106"]),
        ("accelerate_model_zero_grad", ["SYN106"]),
        ("off_by_one_gate", ["SYN107", "SYN101"]),
        ("gates_disagree", ["SYN108"]),
    ],
)
def test_problem_codes(name: str, codes: list[str]) -> None:
    result = fix_source((FIXTURES / f"{name}.in.py").read_text())
    assert [p.code for p in result.problems] == codes
    assert all(p.fixed for p in result.problems)
