"""Fixture pairs: every rewrite and every leave-alone case, compared exactly; idempotence."""

from __future__ import annotations

from pathlib import Path

import pytest

from syncscope.fixes import FixOptions, fix_source
from tests.helpers.fixed import fixed

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "fix"
PAIRS = sorted(FIXTURES.glob("*.in.py"))
LEAVE_ALONE = {
    "accelerate_accumulate",
    "accelerate_accumulate_runnable",
    "ctx_callable_correct",
    "helper_forward_inside",
    "ifelse_forward_inside_no_sync",
    "nanogpt_flag_runnable",
    "stylegan_ddp_sync",
    "ddp_no_sync_correct",
    "ddp_no_sync_forward_only",
    "fsdp1_no_sync_backward_only",
    "fsdp2_toggle",
    "nanogpt_flag_before_forward",
    "single_process",
    "unresolved_wrapper",
    "helper_no_toggle",
    "zip_chunks_unindexed",
}
# left as they are, but said: a loop fix cannot read or rewrite (SYN100, SYN109)
NOT_REWRITTEN = {"unresolved_wrapper", "helper_no_toggle", "zip_chunks_unindexed"}


def _name(path: Path) -> str:
    return path.name.removesuffix(".in.py")


@pytest.mark.parametrize("source", PAIRS, ids=_name)
def test_fixture_pair(source: Path) -> None:
    # GIVEN a loop as people write it WHEN fixed THEN the result is the .out.py file exactly
    expected = source.with_name(_name(source) + ".out.py").read_text()
    result = fixed(source.read_text())
    assert result.fixed == expected
    assert result.changed == (_name(source) not in LEAVE_ALONE)


@pytest.mark.parametrize("source", PAIRS, ids=_name)
def test_fix_is_idempotent(source: Path) -> None:
    once = fixed(source.read_text()).fixed
    again = fixed(once)
    assert again.fixed == once
    assert all(p.code in ("SYN100", "SYN109") for p in again.problems)


def test_leave_alone_cases_report_nothing() -> None:
    for name in LEAVE_ALONE - NOT_REWRITTEN:
        result = fixed((FIXTURES / f"{name}.in.py").read_text())
        assert result.problems == (), name


def test_unresolved_wrapper_is_said_not_rewritten() -> None:
    result = fixed((FIXTURES / "unresolved_wrapper.in.py").read_text())
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
    result = fixed((FIXTURES / f"{name}.in.py").read_text())
    assert [p.code for p in result.problems] == codes
    assert all(p.fixed for p in result.problems)


def test_ddp_only_under_a_condition_keeps_the_toggle_under_it() -> None:
    # the script's own guard where the loop can read it, isinstance where it cannot
    fixed = {
        name: fix_source((FIXTURES / f"{name}.in.py").read_text()).fixed
        for name in ("nanogpt_ddp_optional", "ddp_optional_in_function")
    }
    assert "model.no_sync() if ddp and not is_last else" in fixed["nanogpt_ddp_optional"]
    assert (
        "model.no_sync() if isinstance(model, DDP) and not is_last else"
        in fixed["ddp_optional_in_function"]
    )


def test_flag_style_is_guarded_too() -> None:
    source = (FIXTURES / "nanogpt_ddp_optional.in.py").read_text()
    result = fix_source(source, FixOptions(style="flag"))
    assert (
        "        is_last = micro_step == gradient_accumulation_steps - 1\n"
        "        if ddp:\n"
        "            model.require_backward_grad_sync = is_last\n"
        "        loss = model(x)"
    ) in result.fixed
    assert fix_source(result.fixed).problems == ()  # nanoGPT's own form: nothing left


TEMPLATE = """import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.fsdp import fully_shard

model = torch.nn.Linear(4, 4)
{wrap}
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for i, batch in enumerate(loader):
    loss = model(batch).sum()
    loss.backward()
    if (i + 1) % 4 == 0:
        optimizer.step()
        optimizer.zero_grad()
"""


@pytest.mark.parametrize(
    ("wrap", "expected"),
    [
        ("if dist.is_initialized():\n    model = DDP(model)", "if dist.is_initialized() and not"),
        ("if world_size > 1:\n    model = DDP(model)", "if world_size > 1 and not"),
        ("if single:\n    pass\nelse:\n    model = DDP(model)", "if not single and not"),
        ("if not ddp:\n    pass\nelse:\n    model = DDP(model)", "if ddp and not"),
        ("if a or b:\n    model = DDP(model)", "if (a or b) and not"),
        ("model = model if cpu_only else DDP(model)", "if not cpu_only and not"),
        ("model = DDP(model)", "model.no_sync() if not is_last"),
        ("if ddp:\n    model = DDP(model)\nelse:\n    model = DDP(model)", "() if not is_last"),
        ("if ddp:\n    fully_shard(model)", "if ddp:\n        model.set_requires_gradient_sync("),
    ],
)
def test_guard_read_from_the_script(wrap: str, expected: str) -> None:
    flags = "single = a = b = cpu_only = ddp = world_size = 0\n"  # module level: readable
    source = TEMPLATE.format(wrap=wrap).replace("model = torch", flags + "model = torch", 1)
    result = fix_source(source)
    assert expected in result.fixed, result.fixed
    assert fix_source(result.fixed).fixed == result.fixed
