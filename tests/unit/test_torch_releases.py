"""What changes between the torch releases syncscope supports (docs/torch-versions.md), read
without running them: FSDP2's parameter groups, which moved from one ``_fsdp_param_group``
(torch 2.6, 2.7 and 2.8 checked) to a list ``_fsdp_param_groups`` (2.13, 2.15); which
commands run where torch is not installed at all (the pre-commit hook's and CI check's
environment); and the floor, named alike by pyproject, the README and the releases' table.

The releases themselves run the suite in their own environments: .ci/run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from syncscope.capture.recorder.gradients import fsdp_param_groups, fsdp_reduce_grads

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "fix"


def _group(reduce_grads: bool) -> SimpleNamespace:
    return SimpleNamespace(reduce_grads=reduce_grads, fsdp_params=[], mesh_info=None)


def _state_before_2_13(group: SimpleNamespace | None) -> SimpleNamespace:
    """An FSDPState as torch 2.6, 2.7 and 2.8 build it: one group, or None for a module holding no
    parameters of its own (torch/distributed/fsdp/_fully_shard/_fsdp_state.py)."""
    return SimpleNamespace(_fsdp_param_group=group)


def test_param_groups_are_read_on_both_layouts() -> None:
    # GIVEN: a 2.8-style state (one group), a 2.13-style state (a list), an empty 2.8 state
    one, two, three = _group(True), _group(True), _group(False)
    # WHEN / THEN: each reads as the list of its groups
    assert fsdp_param_groups(_state_before_2_13(one)) == [one]
    assert fsdp_param_groups(SimpleNamespace(_fsdp_param_groups=[two, three])) == [two, three]
    assert fsdp_param_groups(_state_before_2_13(None)) == []


def test_a_gradient_sync_turned_off_reads_off_on_torch_2_8() -> None:
    # GIVEN: a root and a child state of torch 2.8's layout after
    # set_requires_gradient_sync(False) (each group's reduce_grads False)
    root, child = _state_before_2_13(_group(False)), _state_before_2_13(_group(False))
    root._state_ctx = SimpleNamespace(all_states=[root, child])
    # WHEN / THEN: the next backward will not reduce (read as True before, a false clean)
    assert fsdp_reduce_grads(root) is False
    # and turned back on, it will
    for state in (root, child):
        state._fsdp_param_group.reduce_grads = True
    assert fsdp_reduce_grads(root) is True


# a meta-path finder that refuses torch: this interpreter as an environment without torch
_NO_TORCH = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "numpy"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name.split(".")[0])
sys.meta_path.insert(0, NoTorch())
from syncscope.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _without_torch(*args: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path)
    return subprocess.run(
        [sys.executable, "-c", _NO_TORCH, *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, check=False,
    )  # fmt: skip


@pytest.mark.slow
def test_fix_check_runs_without_torch() -> None:
    # GIVEN: an environment without torch (the pre-commit hook's)
    # WHEN: the check reads a loop to fix and a correct one
    done = _without_torch(
        "fix", "--check", str(FIXTURES / "ddp_no_sync_backward_only.in.py"),
        str(FIXTURES / "ddp_no_sync_correct.in.py"),
    )  # fmt: skip
    # THEN: it reports the one to fix, exit 1, as where torch is installed
    assert done.returncode == 1, done.stderr
    assert " SYN102 " in done.stdout and "ddp_no_sync_correct" not in done.stdout
    assert done.stderr == ""


@pytest.mark.slow
def test_profile_without_torch_says_so_in_one_line() -> None:
    # GIVEN: an environment without torch
    for args in (("profile", "--nproc-per-node", "2", "train.py"), ("build-kernel",)):
        # WHEN: a command that runs torch
        done = _without_torch(*args)
        # THEN: one line naming what is missing, exit 2, no traceback
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.splitlines()
        assert line == (
            f"syncscope: error: {args[0]} needs torch, which is not installed in this "
            "environment: install the torch your job uses first (pip install torch), "
            "then run it again"
        )


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="no torch installed here to leave alone"
)
def test_installing_syncscope_leaves_this_environments_torch_as_it_is() -> None:
    """.ci/run runs this in the floor release's environment and the newest's."""
    import torch

    # GIVEN: this environment's torch (the floor release's in .ci/run's floor environment)
    # WHEN: pip resolves syncscope with its torch extra here, offline (nothing downloaded:
    # what is installed satisfies the requirements, or pip says it cannot)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index",
         "--no-build-isolation", "--quiet", "--report", "-", f"{ROOT}[torch]"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, check=False,
    )  # fmt: skip
    # THEN: it resolves, and installs syncscope only: torch stays the one installed
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    installs = [item["metadata"]["name"].lower() for item in report["install"]]
    assert installs == ["syncscope"], f"torch {torch.__version__}: pip would install {installs}"


def test_the_floor_is_named_alike_everywhere() -> None:
    import re

    # GIVEN: the floor pyproject's torch extra sets (.ci/run tests it)
    (floor,) = re.findall(r'"torch>=([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    # WHEN / THEN: the README, docs/gpu.md and the releases' table name no other
    for page in ("README.md", "docs/torch-versions.md", "docs/gpu.md"):
        named = set(re.findall(r"torch>=([\d.]+)", (ROOT / page).read_text()))
        assert named == {floor}, (page, named)
    table = (ROOT / "docs" / "torch-versions.md").read_text()
    (row,) = [line for line in table.splitlines() if ", the floor |" in line]
    assert row.startswith(f"| {floor}."), row
