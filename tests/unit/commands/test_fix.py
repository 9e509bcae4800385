"""``syncscope fix`` as users run it, in process through ``main()``: exit statuses 0/1/2,
stdout and stderr, --apply safety (the console script itself:
tests/integration/test_cli_launches.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from syncscope import cli

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "fix"


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


Run = Callable[..., Done]


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    """run(*args, cwd=DIR): ``syncscope fix *args`` from DIR, what it printed and returned."""

    def fix(*args: str, cwd: Path) -> Done:
        monkeypatch.chdir(cwd)
        capsys.readouterr()
        status = cli.main(["fix", *args])
        out = capsys.readouterr()
        return Done(status, out.out, out.err)

    return fix


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text((FIXTURES / "ddp_no_suppression_modulo.in.py").read_text())
    return path


def test_dry_run_prints_diff_and_problems_exit_1(run: Run, script: Path) -> None:
    done = run("train.py", cwd=script.parent)
    assert done.returncode == 1
    assert done.stdout.startswith("--- a/train.py\n+++ b/train.py\n")
    assert "train.py:9: SYN101 no sync suppression" in done.stderr
    assert script.read_text() == (FIXTURES / "ddp_no_suppression_modulo.in.py").read_text()
    # nothing was written: a problem reads "--apply fixes it", never "(fixed)"
    assert "(fixed)" not in done.stderr and "(--apply fixes it)" in done.stderr


def test_nothing_to_fix_exit_0(run: Run, tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text((FIXTURES / "nanogpt_flag_before_forward.in.py").read_text())
    done = run("ok.py", cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_apply_writes_and_keeps_backup(run: Run, script: Path) -> None:
    original = script.read_text()
    done = run("train.py", "--apply", cwd=script.parent)
    assert done.returncode == 0, done.stderr
    assert script.read_text() == (FIXTURES / "ddp_no_suppression_modulo.out.py").read_text()
    assert script.with_name("train.py.bak").read_text() == original
    assert "SYN101 no sync suppression" in done.stderr and "(fixed)" in done.stderr
    # running it again changes nothing
    again = run("train.py", cwd=script.parent)
    assert (again.returncode, again.stdout) == (0, "")


def test_apply_no_backup(run: Run, script: Path) -> None:
    done = run("train.py", "--apply", "--no-backup", cwd=script.parent)
    assert done.returncode == 0
    assert not script.with_name("train.py.bak").exists()
    assert sorted(p.name for p in script.parent.iterdir()) == ["train.py"]


def test_syntax_error_refused_exit_2(run: Run, tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("for i in range(3)\n    pass\n")
    done = run("bad.py", "--apply", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("syncscope: error: bad.py: syntax error at line")
    assert len(done.stderr.splitlines()) == 1
    assert bad.read_text() == "for i in range(3)\n    pass\n"


def test_outside_working_tree_refused_unless_allowed(
    run: Run, script: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    done = run(str(script), "--apply", cwd=elsewhere)
    assert done.returncode == 2
    assert "outside the working tree" in done.stderr and "--allow-outside" in done.stderr
    assert "is_last" not in script.read_text()
    allowed = run(str(script), "--apply", "--allow-outside", cwd=elsewhere)
    assert allowed.returncode == 0
    assert "is_last" in script.read_text()


def test_unresolved_wrapper_exit_1_no_diff(run: Run, tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text((FIXTURES / "unresolved_wrapper.in.py").read_text())
    done = run("t.py", cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert "SYN100" in done.stderr and "not rewritten" in done.stderr


def test_bad_style_and_missing_file_exit_2(run: Run, script: Path) -> None:
    assert run("train.py", "--style", "magic", cwd=script.parent).returncode == 2
    missing = run("nope.py", cwd=script.parent)
    assert missing.returncode == 2 and "nope.py: no such file" in missing.stderr


def test_from_a_changed_script_refused(run: Run, script: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "report.json").write_text(
        '{"schema_version": 1, "script": {"path": "train.py", "sha256": "00"}, "findings": []}'
    )
    done = run("train.py", "--from", str(run_dir), "--apply", cwd=script.parent)
    assert done.returncode == 2 and "changed since the run" in done.stderr
