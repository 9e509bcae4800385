"""``syncscope fix`` on hostile scripts and file layouts: bounded, one line, nothing clobbered."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from syncscope import cli

FIXABLE = Path(__file__).resolve().parents[1] / "fixtures" / "fix" / "ddp_flag_after_forward.in.py"


def _fix(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = cli.main(["fix", *argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return status, err


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("x = " + "(" * 5000 + "1" + ")" * 5000 + "\n", "too many nested parentheses"),
        ("x = " + "+".join(["1"] * 20000) + "\n", "nested too deeply for Python to compile"),
        ("x = " + "+".join(["1"] * 900) + "\n", "nested too deeply for syncscope fix"),
        ("x = -" + "-" * 3000 + "1\n", "nested too deeply"),
    ],
    ids=["5000-parens", "20000-term-sum", "900-term-sum", "3000-unary"],
)
def test_deep_nesting_is_refused_in_one_line(
    source: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "deep.py"
    script.write_text(source)
    status, err = _fix([str(script)], capsys)
    assert status == 2
    assert err.count("\n") == 1 and message in err


def test_apply_writes_through_a_symlink_and_keeps_every_backup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "real.py"
    target.write_text(FIXABLE.read_text())
    link = tmp_path / "link.py"
    link.symlink_to(target)
    (tmp_path / "real.py.bak").write_text("the user's own backup\n")
    status, err = _fix(["--apply", "link.py"], capsys)
    assert status == 0, err
    assert link.is_symlink() and link.resolve() == target
    assert target.read_text() != FIXABLE.read_text()
    assert (tmp_path / "real.py.bak").read_text() == "the user's own backup\n"
    assert (tmp_path / "real.py.bak.1").read_text() == FIXABLE.read_text()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".real.py.")]


# shared with benchmarks/bench_fix.py: one loop with no_sync() around backward only
LOOP = (Path(__file__).parent.parent / "fixtures" / "no_sync_backward_only_loop.txt").read_text()


def test_every_one_of_many_loops_is_fixed_in_one_run() -> None:
    """30 accumulation loops in one file (each no_sync around backward only): every one is
    rewritten (before the fix-per-pass batching, no more than 24 ever were, and the time grew
    quadratically; the timing is in CHANGELOG, not asserted here)."""
    from syncscope.fixes.codemod import fix_source

    source = "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
    source += "".join(LOOP.format(i=i) for i in range(30))
    source += "\nmodel = DDP(torch.nn.Linear(2, 2))\n"
    result = fix_source(source, path="many.py")
    assert len(result.problems) == 30
    assert all(p.fixed for p in result.problems), [p for p in result.problems if not p.fixed]
    # each loop now enters no_sync before the forward, for every micro-batch but the last
    assert result.fixed.count("with (model.no_sync() if not is_last else") == 30
    compile(result.fixed, "many.py", "exec")
