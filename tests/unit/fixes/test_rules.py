"""Rules and wrapper resolution on small inline sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from syncscope.errors import SyncscopeError
from syncscope.fixes import FixOptions, fix_source
from syncscope.fixes.run_hints import load_hints
from tests.helpers.reports import report_run_dir

HEADER = "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
LOOP = """
for i, batch in enumerate(loader):
    loss = model(batch).sum()
    loss.backward()
    if (i + 1) % accum == 0:
        optimizer.step()
        optimizer.zero_grad()
"""


def test_wrapper_bound_two_ways_is_unresolved() -> None:
    source = (
        HEADER
        + "from torch.distributed.fsdp import fully_shard\n"
        + "model = DDP(net) if use_ddp else fully_shard(net)\n"
        + LOOP
    )
    (problem,) = fix_source(source).problems
    assert problem.code == "SYN100"
    assert "depending on the run" in problem.message


def test_style_that_contradicts_the_wrapper_is_an_error() -> None:
    with pytest.raises(SyncscopeError, match="--style fsdp2 does not fit"):
        fix_source(HEADER + "model = DDP(net)\n" + LOOP, FixOptions(style="fsdp2"))


def test_syntax_error_is_one_line_error() -> None:
    with pytest.raises(SyncscopeError, match="syntax error at line 1"):
        fix_source("for (:\n", path="bad.py")


def test_existing_contextlib_import_is_not_duplicated() -> None:
    result = fix_source("import contextlib\n" + HEADER + "model = DDP(net)\n" + LOOP)
    assert result.fixed.count("import contextlib") == 1


def test_gate_counter_changed_between_forward_and_gate_twice_is_not_rewritten() -> None:
    loop = LOOP.replace("    if (i + 1)", "    i += 1\n    i += 1\n    if (i + 1)")
    (problem,) = fix_source(HEADER + "model = DDP(net)\n" + loop).problems
    assert problem.code == "SYN101" and not problem.fixed
    assert "last" in problem.suggestion


def test_from_run_names_a_wrapper_decided_elsewhere(tmp_path: Path) -> None:
    # GIVEN a model built in another file, and a profile that saw DDP sync every micro-batch
    script = tmp_path / "train.py"
    script.write_text("import torch\nfrom lib import build\nmodel = build()\n" + LOOP)
    finding = {
        "kind": "redundant-sync",
        "cause": "no-no_sync",
        "sources": [{"role": "forward", "file": str(script), "line": 5}],
        "fix": {"style": "ddp-no_sync"},
    }
    hints = load_hints(report_run_dir(tmp_path, script, [finding]), script, script.read_bytes())
    # WHEN fixed with those hints THEN the loop gets the DDP no_sync form
    result = fix_source(script.read_text(), FixOptions(hints=hints))
    assert "with (model.no_sync() if not is_last else contextlib.nullcontext()):" in result.fixed


def _helper_toggle_run(tmp_path: Path) -> tuple[Path, Path]:
    """train.py whose sync flag is toggled through a helper after the forward (line 7,
    invisible to syntax), and a run that saw the toggle there (missing-sync)."""
    script = tmp_path / "train.py"
    body = LOOP.replace(
        "    loss.backward()", "    set_sync(model, (i + 1) % accum == 0)\n    loss.backward()"
    )
    script.write_text(HEADER + "model = DDP(net)\n" + body)
    finding = {
        "kind": "missing-sync",
        "sources": [{"role": "toggle", "file": str(script), "line": 7}],
        "fix": {"style": "ddp-flag"},
    }
    return script, report_run_dir(tmp_path, script, [finding])


def test_from_run_moves_a_helper_toggle(tmp_path: Path) -> None:
    # GIVEN the flag toggled through a helper after the forward (invisible to syntax)
    script, run = _helper_toggle_run(tmp_path)
    hints = load_hints(run, script, script.read_bytes())
    result = fix_source(script.read_text(), FixOptions(hints=hints))
    lines = result.fixed.splitlines()
    assert lines.index("    set_sync(model, (i + 1) % accum == 0)") < lines.index(
        "    loss = model(batch).sum()"
    )
    assert [p.code for p in result.problems] == ["SYN104"]


def test_from_run_refuses_a_changed_script(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(HEADER + LOOP)
    run = report_run_dir(tmp_path, script, [], sha="0" * 64)
    with pytest.raises(SyncscopeError, match="changed since the run"):
        load_hints(run, script, script.read_bytes())


def test_from_run_without_report_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SyncscopeError, match=r"no report\.json"):
        load_hints(tmp_path, tmp_path / "x.py", b"")


STEP_FUNCTION = """import torch
from torch import nn


def training_step(model, opt, batches):
    for i, (x, y) in enumerate(batches):
        loss = nn.functional.mse_loss(model(x), y) / len(batches)
        loss.backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.parametrize(
    ("finding", "added"),
    [
        (
            {"cause": "hsdp-all-reduce-every-micro-batch", "fix": {"style": "hsdp"}},
            "        model.set_requires_all_reduce(is_last)",
        ),
        (
            {"cause": "fsdp-sharded-accumulation", "fix": {"style": "fsdp2"}},
            "        model.set_requires_gradient_sync(is_last)",
        ),
        (
            {"cause": "no-no_sync", "fix": {"style": "ddp-no_sync"}},
            "        with (model.no_sync() if not is_last else contextlib.nullcontext()):",
        ),
    ],
)
def test_from_run_fixes_a_loop_in_a_function_whose_step_follows_it(
    tmp_path: Path, finding: dict[str, object], added: str
) -> None:
    # GIVEN `training_step(model, opt, batches)`: the model is a parameter (its wrapper
    # known only from the run), the step after the loop, the sources inside the function
    script = tmp_path / "train.py"
    script.write_text(STEP_FUNCTION)
    sources = [
        {"role": role, "file": str(script), "line": line, "function": "training_step"}
        for role, line in (("forward", 7), ("backward", 8), ("step", 9))
    ]
    report = [{"kind": "redundant-sync", "sources": sources, **finding}]
    hints = load_hints(report_run_dir(tmp_path, script, report), script, script.read_bytes())
    # WHEN fixed from the run THEN the loop is rewritten in the run's wrapper's terms
    result = fix_source(script.read_text(), FixOptions(hints=hints))
    assert not result.notes
    lines = result.fixed.splitlines()
    assert "        is_last = i == len(batches) - 1" in lines
    assert added in lines
    assert [(p.code, p.fixed) for p in result.problems] == [("SYN101", True)]
    if "all_reduce" in added:  # HSDP: the cause names the all-reduce, not the reduce-scatter
        assert "HSDP all-reduces across replicas" in result.problems[0].message
        assert "set_requires_gradient_sync" not in result.fixed


def test_hsdp_all_reduce_toggle_is_a_toggle() -> None:
    # a loop that already skips the cross-replica all-reduce off the last micro-batch is fine
    source = STEP_FUNCTION.replace(
        "        loss = nn",
        "        model.set_requires_all_reduce(i == len(batches) - 1)\n        loss = nn",
    )
    source = "from torch.distributed.fsdp import fully_shard\nmodel = fully_shard(net)\n" + source
    result = fix_source(source)
    assert not result.problems and not result.changed


def test_contextlib_import_goes_in_sorted_order_among_the_standard_library() -> None:
    # GIVEN: a script whose standard-library imports come before and after "contextlib"
    stdlib = "import argparse\nimport os\nfrom typing import Any\n\n"
    # WHEN: the fix needs contextlib.nullcontext
    fixed = fix_source(stdlib + HEADER + "model = DDP(net)\n" + LOOP).fixed
    # THEN: the import sits where isort puts it, not after the last import
    assert fixed.startswith(
        "import argparse\nimport contextlib\nimport os\nfrom typing import Any\n\n"
    )


def test_contextlib_import_opens_its_own_section_before_third_party_imports() -> None:
    fixed = fix_source('"""A loop."""\n\n' + HEADER + "model = DDP(net)\n" + LOOP).fixed
    assert fixed.startswith('"""A loop."""\n\nimport contextlib\n\nimport torch\n')


def test_from_run_applies_to_a_renamed_identical_copy(tmp_path: Path) -> None:
    """The run profiled train.py; fix --from on copy.py, the same bytes, said
    nothing to fix. The content hash matched, so the run's sources apply to the copy."""
    script, run = _helper_toggle_run(tmp_path)
    copy = tmp_path / "elsewhere" / "copy.py"
    copy.parent.mkdir()
    copy.write_bytes(script.read_bytes())
    script.unlink()  # moved, not copied: the run's path no longer exists
    hints = load_hints(run, copy, copy.read_bytes())
    assert hints.lines == frozenset({7})
    result = fix_source(copy.read_text(), FixOptions(hints=hints))
    assert [p.code for p in result.problems] == ["SYN104"]
