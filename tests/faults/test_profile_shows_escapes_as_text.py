"""End to end: a script whose name, arguments and exception text carry
terminal escapes, run under ``syncscope profile``: syncscope's own output shows them as
text (the user's traceback on stderr is the user's, printed by Python, and left alone)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "\x1b[2J\x1b]0;owned\x07\x1b[31m"
RAW = ("\x1b[2J", "\x1b]0;", "\x07", "\x1b[31m")

SCRIPT = """
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(nn.Linear(4, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
if dist.get_rank() == 1:
    raise ValueError("boom " + {hostile!r})
"""


@pytest.mark.slow  # launches 2 ranks
def test_profile_shows_escapes_in_script_name_arguments_and_exception_as_text(
    tmp_path: Path,
) -> None:
    script = tmp_path / f"train{HOSTILE}.py"
    script.write_text(SCRIPT.format(hostile=HOSTILE))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    command = [sys.executable, "-m", "syncscope", "profile", "--nproc-per-node", "2"]
    done = subprocess.run(
        [*command, "--out", str(tmp_path / "run"), str(script), f"--arg={HOSTILE}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # the run failed on rank 1: exit 1 as plain torchrun, the failure reported
    assert done.returncode == 1, done.stderr[-2000:]
    assert "run-failed" in done.stdout
    # the summary (stdout) names the script, the argument and the exception as text
    for raw in RAW:
        assert raw not in done.stdout, repr(raw)
    assert "train\\x1b[2J\\x1b]0;owned\\x07\\x1b[31m.py" in done.stdout
    assert "--arg=\\x1b[2J" in done.stdout
    assert "ValueError: boom \\x1b[2J" in done.stdout
    # syncscope's own lines on stderr too
    ours = [line for line in done.stderr.splitlines() if line.startswith("syncscope:")]
    assert ours
    for line in ours:
        for raw in RAW:
            assert raw not in line, line
