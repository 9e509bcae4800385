"""``syncscope fix`` is never silent: an accumulation loop of a distributed file that no rule
rewrites is said (SYN109), with the form to write in the script's own names; ``fix`` and
``fix --check`` exit 1 on it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from syncscope.cli import main
from syncscope.fixes import fix_source
from tests.helpers.fixed import fixed

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "fix"


def _sites(name: str) -> list[tuple[str, int, str, str]]:
    result = fixed((FIXTURES / f"{name}.in.py").read_text())
    return [(p.code, p.line, p.suggestion, p.snippet) for p in result.problems]


def test_a_backward_in_a_helper_without_a_toggle_is_said_with_the_scripts_names() -> None:
    # GIVEN a loop whose backward runs in train_step(), which takes no sync flag
    ((code, line, why, snippet),) = _sites("helper_no_toggle")
    # THEN one SYN109 at the loop, saying why, with the form in the script's own names
    assert (code, line) == ("SYN109", 16)
    assert "train_step()" in why
    assert snippet.splitlines() == [
        "for step, batch in enumerate(loader):",
        "    is_last = (step + 1) % grad_accum == 0",
        "    with (model.no_sync() if not is_last else contextlib.nullcontext()):",
        "        train_step(batch)",
        "    if is_last:",
        "        optimizer.step()",
        "        optimizer.zero_grad()",
    ]


def test_an_unindexed_inner_loop_is_said_with_the_step_outside_it() -> None:
    ((code, line, why, snippet),) = _sites("zip_chunks_unindexed")
    assert (code, line) == ("SYN109", 7)
    assert "no index" in why
    lines = snippet.splitlines()
    assert lines[:2] == [
        "for inputs, targets in loader:",
        "    for xm, ym in zip(inputs.chunk(4), targets.chunk(4)):",
    ]
    assert "            loss = torch.nn.functional.mse_loss(model(xm), ym) / 4" in lines
    assert lines[-2:] == ["    opt.step()", "    opt.zero_grad()"]


@pytest.mark.parametrize(
    "name", sorted(p.name.removesuffix(".in.py") for p in FIXTURES.glob("*.in.py"))
)
def test_every_suggestion_is_python(name: str) -> None:
    for _code, _line, _why, snippet in _sites(name):
        if snippet:
            ast.parse(snippet)


def test_a_file_without_distributed_training_has_no_site() -> None:
    source = (FIXTURES / "helper_no_toggle.in.py").read_text()
    plain = source.replace("model = DDP(torch.nn.Linear(4, 4))", "model = torch.nn.Linear(4, 4)")
    plain = plain.replace("from torch.nn.parallel import DistributedDataParallel as DDP\n", "")
    assert fix_source(plain).problems == ()


def test_a_continue_before_the_backward_is_no_gate() -> None:
    # a loop that skips empty batches and steps on every one is no accumulation loop
    source = (
        "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
        "model = DDP(torch.nn.Linear(2, 2))\n"
        "for x in loader:\n    if x is None:\n        continue\n"
        "    model(x).sum().backward()\n    optimizer.step()\n    optimizer.zero_grad()\n"
    )
    assert fix_source(source).problems == ()


def test_fix_exits_1_and_prints_the_form(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fix", str(FIXTURES / "helper_no_toggle.in.py")]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing to diff
    assert "SYN109" in captured.err
    assert "        train_step(batch)" in captured.err  # the snippet, indented under the line


def test_fix_check_fails_on_what_fix_cannot_rewrite(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fix", "--check", str(FIXTURES / "zip_chunks_unindexed.in.py")]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert line.endswith(
        "SYN109 accumulation loop over a DDP model 'model' (step after an "
        "inner loop) that syncscope fix does not rewrite"
    )


def test_fix_check_fails_on_the_if_else_backward_only_loop(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the most common spelling of the bug: the step in the else, no_sync() on the backward
    assert main(["fix", "--check", str(FIXTURES / "ifelse_forward_before.in.py")]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert ":21: SYN102 no_sync() wraps the backward only" in line
