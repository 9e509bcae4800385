"""A rank that ``profile`` started must not recreate the run directory once it is gone (an
interrupted ``fix --verify`` removes its temporary run directories): a slow rank that reached
capture after the cleanup left ``syncscope-verify-*/fixed/ranks/rank-00001.jsonl`` behind on a
loaded CI machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # starts a rank process (imports torch)
def test_a_profiled_rank_never_recreates_a_removed_run_directory(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    gone = tmp_path / "verify-tmp" / "fixed"  # removed: never created here
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        RANK="1",
        WORLD_SIZE="2",
        LOCAL_RANK="1",
        SYNCSCOPE_PROFILE_PID=str(os.getpid()),
    )
    done = subprocess.run(
        [sys.executable, "-m", "syncscope.launch.attach", "--out", str(gone), str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "was removed before this rank started" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "ran" not in done.stdout
    assert not (tmp_path / "verify-tmp").exists()
