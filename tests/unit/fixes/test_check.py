"""``syncscope fix --check PATH...``, the pre-commit hook the repository ships, and the
GitHub Actions job of docs/fix.md: each one run here on the fix fixtures."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from syncscope.cli import main
from tests.helpers.fixed import fixed

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "fix"


def expected_lines(files: list[Path], shown: dict[Path, str] | None = None) -> list[str]:
    """What ``fix`` itself finds in each file, in the check's format."""
    out = []
    for path in files:
        result = fixed(path.read_text(encoding="utf-8"))
        name = (shown or {}).get(path, str(path))
        out += [f"{name}:{p.line}: {p.code} {p.message}" for p in result.problems]
    return out


# the rule fixtures (short files, every rule among them): the runnable ones add time, not cases
RULE_FIXTURES = sorted(p for p in FIXTURES.glob("*.py") if "CHECKPOINT" not in p.read_text())


def test_a_directory_lists_every_problem_fix_finds_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for path in RULE_FIXTURES:
        shutil.copy(path, tmp_path / path.name)
    assert main(["fix", "--check", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    files = sorted(tmp_path.glob("*.py"))
    assert out == expected_lines(files)
    assert any(" SYN102 " in line for line in out)
    # every line is file:line: SYNxxx message
    assert all(re.match(r"^\S+\.py:\d+: SYN\d{3} \S", line) for line in out)


def test_clean_files_exit_0_and_print_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    outs = [p for p in RULE_FIXTURES if p.name.endswith(".out.py")]  # nothing left to rewrite
    clean = [str(p) for p in outs if not expected_lines([p])]
    assert len(clean) >= len(outs) - 3
    assert main(["fix", "--check", *clean]) == 0
    assert capsys.readouterr().out == ""


def test_bad_paths_and_unparsable_files_are_one_line_each_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "broken.py").write_text("def f(:\n    loss.backward()\n")
    shutil.copy(FIXTURES / "ddp_no_sync_backward_only.in.py", tmp_path / "train.py")
    status = main(["fix", "--check", str(tmp_path), str(tmp_path / "missing.py")])
    captured = capsys.readouterr()
    assert status == 2
    errors = captured.err.strip().splitlines()
    assert len(errors) == 2 and "Traceback" not in captured.err
    assert "broken.py: syntax error" in errors[0] and "missing.py: no such file" in errors[1]
    assert " SYN102 " in captured.out  # the good file is still checked


def test_check_refuses_options_that_write_or_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fix", "--check", "--apply", str(FIXTURES)]) == 2
    assert "--check reads the code only" in capsys.readouterr().err


def test_hidden_and_environment_folders_are_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = FIXTURES / "ddp_no_suppression_modulo.in.py"
    for folder in (".git", "venv", "site-packages", "myenv"):
        (tmp_path / folder).mkdir()
        shutil.copy(bad, tmp_path / folder / "train.py")
    (tmp_path / "myenv" / "pyvenv.cfg").write_text("home = /usr\n")
    assert main(["fix", "--check", str(tmp_path)]) == 0
    assert capsys.readouterr().out == ""


def test_a_1000_line_file_is_checked_in_under_a_second_of_cpu(tmp_path: Path) -> None:
    loop = (FIXTURES / "ddp_no_suppression_modulo.in.py").read_text(encoding="utf-8")
    pad = "".join(
        f"def helper_{i}(x):\n    y = x * {i}\n    return y + 1\n\n\n" for i in range(200)
    )
    path = tmp_path / "long.py"
    path.write_text(loop + "\n\n" + pad, encoding="utf-8")
    assert len(path.read_text().splitlines()) >= 1000
    main(["fix", "--check", str(path)])  # libcst imported once, as in any run
    started = time.process_time()
    assert main(["fix", "--check", str(path)]) == 1
    assert time.process_time() - started < 1.0


def _command(words: list[str]) -> list[str]:
    """``syncscope ...`` as installed, else this interpreter's ``-m syncscope``."""
    if words[0] == "syncscope" and shutil.which("syncscope") is None:
        return [sys.executable, "-m", "syncscope", *words[1:]]
    return words


@pytest.mark.slow
def test_the_pre_commit_hook_entry_runs_on_a_fixture_directory(tmp_path: Path) -> None:
    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
    assert hook["id"] == "syncscope-fix-check" and hook["types"] == ["python"]
    files = [FIXTURES / "ddp_no_sync_backward_only.in.py", FIXTURES / "ddp_no_sync_correct.in.py"]
    # pre-commit appends the staged files to the entry
    cmd = _command([*shlex.split(hook["entry"]), *map(str, files)])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines() == expected_lines(files)
    clean = _command([*shlex.split(hook["entry"]), str(files[1])])
    assert subprocess.run(clean, capture_output=True, timeout=120, check=False).returncode == 0


def _ci_steps() -> list[str]:
    text = (ROOT / "docs" / "fix.md").read_text(encoding="utf-8")
    block = text.split("<!-- syncscope-ci-snippet", 1)[1].split("```yaml\n", 1)[1]
    job = yaml.safe_load(block.split("```", 1)[0])
    steps = next(iter(job["jobs"].values()))["steps"]
    return [s["run"] for s in steps if "run" in s]


@pytest.mark.slow
def test_the_github_actions_job_fails_on_a_bad_loop_and_passes_a_clean_one(tmp_path: Path) -> None:
    (check,) = [run for run in _ci_steps() if run.startswith("syncscope ")]
    assert any("pip install" in run and "syncscope" in run for run in _ci_steps())
    for name, status in (("ddp_no_sync_backward_only.in.py", 1), ("ddp_no_sync_correct.out.py", 0)):
        checkout = tmp_path / name
        (checkout / "src").mkdir(parents=True)
        shutil.copy(FIXTURES / name, checkout / "src" / "train.py")
        done = subprocess.run(
            _command(shlex.split(check)), cwd=checkout, capture_output=True, text=True,
            timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == status, done.stderr
        if status:
            assert done.stdout.startswith("src/train.py:") and " SYN102 " in done.stdout


STYLEGAN2_LOOP = """import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def ddp_sync(module, sync):
    if sync or not isinstance(module, DDP):
        return contextlib.nullcontext()
    return module.no_sync()


generator = DDP(torch.nn.Linear(8, 16))
discriminator = DDP(torch.nn.Linear(16, 1))
opt_g = torch.optim.Adam(generator.parameters())
opt_d = torch.optim.Adam(discriminator.parameters())
for batch in loader:
    for micro in range(accum):
        sync = micro == accum - 1
        with ddp_sync(discriminator, sync):
            d_loss = discriminator(batch[micro]).mean()
        d_loss.backward()
        with ddp_sync(generator, sync), ddp_sync(discriminator, False):
            g_loss = -discriminator(generator(noise[micro])).mean()
        g_loss.backward()
    opt_d.step()
    opt_g.step()
    opt_d.zero_grad()
    opt_g.zero_grad()
"""


def test_a_sync_helper_around_each_forward_is_the_correct_toggle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """stylegan2-ada's ``ddp_sync(module, sync)`` returns ``module.no_sync()`` on every
    micro-batch but the last and is entered around the forward (DDP decides there): correct,
    nothing to fix, two models or one."""
    path = tmp_path / "gan.py"
    path.write_text(STYLEGAN2_LOOP)
    assert main(["fix", "--check", str(path)]) == 0
    assert capsys.readouterr().out == ""
    one_model = STYLEGAN2_LOOP.replace(
        "        with ddp_sync(generator, sync), ddp_sync(discriminator, False):\n"
        "            g_loss = -discriminator(generator(noise[micro])).mean()\n"
        "        g_loss.backward()\n",
        "",
    )
    path.write_text(one_model)
    assert main(["fix", "--check", str(path)]) == 0


def test_a_first_path_named_like_an_option_is_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN files whose names start with a dash
    monkeypatch.chdir(tmp_path)
    shutil.copy(FIXTURES / "ifelse_forward_before.in.py", tmp_path / "-train.py")
    (tmp_path / "-x.py").write_text("x = 1\n")
    # THEN they are checked as files, the first one too; a dashed name that is no file is
    # still an unknown option
    assert main(["fix", "--check", "-x.py", "-train.py"]) == 1
    assert capsys.readouterr().out.startswith("-train.py:21: SYN102 ")
    assert main(["fix", "--check", "-x.py"]) == 0
    assert main(["fix", "--check", "-missing.py"]) == 2
