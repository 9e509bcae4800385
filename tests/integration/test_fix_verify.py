"""2 gloo ranks: apply a fix to an example and profile it again to one grad sync per window."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from syncscope.fixes import fix_source
from syncscope.fixes.verify import render, verify

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "ddp_sync_every_step.py"

pytestmark = pytest.mark.slow


def _profile_available() -> bool:
    done = subprocess.run(
        [sys.executable, "-m", "syncscope", "profile", "--help"],
        capture_output=True,
        check=False,
        cwd=ROOT,
    )
    return done.returncode == 0 and EXAMPLE.is_file()


@pytest.mark.skipif(not _profile_available(), reason="syncscope profile or the example is missing")
def test_fixed_example_reaches_one_grad_sync_per_window(tmp_path: Path) -> None:
    # GIVEN the every-micro-batch DDP example, copied with its helper module
    for name in ("ddp_sync_every_step.py", "common.py"):
        shutil.copy(ROOT / "examples" / name, tmp_path / name)
    script = tmp_path / "ddp_sync_every_step.py"
    result = fix_source(script.read_text())
    assert [p.code for p in result.problems] == ["SYN101"]
    # WHEN original and fixed are profiled on 2 gloo ranks
    checked = verify(
        script, result.fixed, ["SYN101"], ("--nproc-per-node", "2", "--hang-timeout", "60")
    )
    # THEN the original syncs every micro-batch, the fix once per window, same losses
    assert all(n == 4 for n in checked.original.grad_syncs)
    assert checked.minimum, render(checked)
    assert not checked.correctness_fix
    assert checked.losses_match is not False, render(checked)
    assert not (tmp_path / "_syncscope_fixed_ddp_sync_every_step.py").exists()
