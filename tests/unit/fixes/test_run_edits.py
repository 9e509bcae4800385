"""``syncscope fix --from RUN`` on findings that are not loop rewrites: a
forward around the DDP wrapper is rewritten to call it; the rewrite never writes a program
that raises where the original did not; a run whose problems it cannot rewrite never ends
in a silent 0."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from syncscope import cli
from syncscope.fixes import FixOptions, fix_source
from syncscope.fixes.run_hints import load_hints
from tests.helpers.reports import report_run_dir

HEADER = "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def _fix(tmp_path: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    status = cli.main(["fix", *args])
    return status, capsys.readouterr().err


BYPASS = """
model = DDP(net)
for i, batch in enumerate(loader):
    loss = model.module(batch).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def _bypass_run(tmp_path: Path) -> tuple[Path, Path]:
    """train.py whose forward at line 6 goes around DDP, and a run that saw it
    (missing-sync, wrapper-bypassed)."""
    script = tmp_path / "train.py"
    script.write_text(HEADER + BYPASS)
    finding = {
        "kind": "missing-sync",
        "severity": "error",
        "cause": "wrapper-bypassed",
        "sources": [{"role": "forward", "file": str(script), "line": 6}],
        "fix": {"style": "call-wrapper", "summary": "Call the DDP wrapper"},
    }
    return script, report_run_dir(tmp_path, script, [finding])


def test_a_forward_around_ddp_is_rewritten_to_call_the_wrapper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a profile that saw the forward at line 6 go around DDP (missing-sync)
    script, run = _bypass_run(tmp_path)
    monkeypatch.chdir(tmp_path)
    # WHEN fixed from it THEN the forward calls the wrapper, and the problem is said
    status, err = _fix(tmp_path, "train.py", "--from", str(run), "--apply", capsys=capsys)
    assert status == 0, err
    fixed = script.read_text()
    assert "    loss = model(batch).sum()\n" in fixed and ".module(" not in fixed
    assert "SYN110" in err and "(fixed)" in err
    ast.parse(fixed)


def test_a_run_whose_errors_are_no_loop_rewrite_exits_1_with_one_line_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text(HEADER + "model = DDP(net)\nfor batch in loader:\n    pass\n")
    finding = {
        "kind": "redundant-sync",
        "severity": "warning",
        "cause": "reduced-twice",
        "sources": [{"role": "all_reduce", "file": str(script), "line": 4}],
        "fix": {"style": "reduced-twice", "summary": "DDP already reduces these."},
    }
    info = {"kind": "fragmented-sync", "severity": "info", "cause": "unbucketed"}
    run = report_run_dir(tmp_path, script, [finding, info])
    monkeypatch.chdir(tmp_path)
    status, err = _fix(tmp_path, "train.py", "--from", str(run), capsys=capsys)
    assert status == 1
    lines = [line for line in err.splitlines() if "is not a loop rewrite" in line]
    assert lines == [
        "train.py:4: redundant-sync (reduced-twice) is not a loop rewrite syncscope fix "
        "makes: DDP already reduces these."
    ]
    # an info alone (a deliberate trade-off) is no reason to fail
    run2 = tmp_path / "run2"
    run2.mkdir()
    (run2 / "report.json").write_text((run / "report.json").read_text().replace("warning", "info"))
    assert _fix(tmp_path, "train.py", "--from", str(run2), capsys=capsys)[0] == 0


FSDP_LOOP = """
from torch.distributed.fsdp import fully_shard
inner = build()
fully_shard(inner)
model = Wrapper(inner)
for i, batch in enumerate(loader):
    loss = model(batch).sum()
    loss.backward()
    if (i + 1) % accum == 0:
        optimizer.step()
        optimizer.zero_grad()
"""


def test_an_fsdp_setter_goes_to_the_fsdp_modules_when_the_model_is_not_one(
    tmp_path: Path,
) -> None:
    # GIVEN a profile that saw the forward go through a module that is not an FSDPModule
    script = tmp_path / "train.py"
    script.write_text("import torch\n" + FSDP_LOOP)
    finding = {
        "kind": "redundant-sync",
        "severity": "warning",
        "cause": "toggle-not-fsdp-module",
        "evidence": {"helper_target": "Wrapper", "fsdp_modules": ["(root)"]},
        "sources": [{"role": "forward", "file": str(script), "line": 8}],
        "fix": {"style": "fsdp2"},
    }
    hints = load_hints(report_run_dir(tmp_path, script, [finding]), script, script.read_bytes())
    result = fix_source(script.read_text(), FixOptions(hints=hints))
    # THEN the setter is never looked up on the model itself (AttributeError), but on the
    # FSDP modules inside it
    assert "model.set_requires_gradient_sync(" not in result.fixed
    assert "for _fsdp_module in model.modules():" in result.fixed
    assert "_fsdp_module.set_requires_gradient_sync(is_last, recurse=False)" in result.fixed
    ast.parse(result.fixed)


def test_a_static_graph_ddp_loop_is_never_rewritten_to_no_sync_its_first_backward(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    loop = BYPASS.replace("model.module(batch)", "model(batch)").replace(
        "    optimizer.step()\n    optimizer.zero_grad()\n",
        "    if (i + 1) % accum == 0:\n        optimizer.step()\n        optimizer.zero_grad()\n",
    )
    script.write_text(HEADER + loop.replace("DDP(net)", "DDP(net, static_graph=True)"))
    finding = {
        "kind": "redundant-sync",
        "severity": "warning",
        "cause": "no-no_sync",
        "sources": [{"role": "forward", "file": str(script), "line": 5}],
        "fix": {"style": "static-graph"},
    }
    hints = load_hints(report_run_dir(tmp_path, script, [finding]), script, script.read_bytes())
    result = fix_source(script.read_text(), FixOptions(hints=hints))
    assert not result.changed
    assert any("static_graph=True" in p.suggestion for p in result.problems)


def test_a_renamed_copy_of_the_profiled_script_gets_the_bypass_rewrite_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a run of train.py, and copy.py with the same bytes (a renamed or moved copy)
    script, run = _bypass_run(tmp_path)
    (tmp_path / "copy.py").write_text(script.read_text())
    monkeypatch.chdir(tmp_path)
    # WHEN the copy is fixed from the run THEN its forward calls the wrapper, as the original's
    status, err = _fix(tmp_path, "copy.py", "--from", str(run), "--apply", capsys=capsys)
    assert status == 0, err
    assert "    loss = model(batch).sum()\n" in (tmp_path / "copy.py").read_text()
    assert "SYN110" in err
