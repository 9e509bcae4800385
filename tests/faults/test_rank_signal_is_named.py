"""A rank that dies of a signal it cannot record (SIGSEGV) is reported with that
signal, not as "killed with SIGKILL": the launcher's failure record is written into the
rank's file as its exit."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from syncscope.rundir import read_events, record_launcher_exit
from tests.helpers.hostile import profile_script

SEGV = textwrap.dedent(
    """
    import os, signal
    import torch, torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    model = DDP(nn.Linear(4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        if dist.get_rank() == 1 and step == 2:
            os.kill(os.getpid(), signal.SIGSEGV)
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    """
)


def _rank_file(run: Path, text: bytes) -> Path:
    (run / "ranks").mkdir(parents=True)
    path = run / "ranks" / "rank-00001.jsonl"
    path.write_bytes(text)
    return path


def test_the_launchers_signal_is_recorded_after_the_last_event(tmp_path: Path) -> None:
    path = _rank_file(tmp_path, b'{"type":"header","t":5}\n{"type":"step_end","t":9}')
    assert record_launcher_exit(tmp_path, 1, "SIGSEGV", 139)
    events = [json.loads(line) for line in path.read_bytes().splitlines()]
    assert events[-1]["type"] == "exit" and events[-1]["status"] == 139
    assert events[-1]["t"] == 9  # where the rank was last seen, not when profile noticed
    assert "SIGSEGV" in events[-1]["reason"]


def test_a_rank_that_recorded_its_own_exit_keeps_it(tmp_path: Path) -> None:
    text = b'{"type":"header","t":5}\n{"type":"exit","t":9,"status":1,"reason":"x"}\n'
    path = _rank_file(tmp_path, text)
    assert not record_launcher_exit(tmp_path, 1, "SIGTERM", 143)
    assert path.read_bytes() == text


@pytest.mark.slow
def test_a_segfaulted_rank_is_reported_with_sigsegv(tmp_path: Path) -> None:
    done, out = profile_script(tmp_path, "segv.py", SEGV)
    assert done.returncode == 128 + 11, done.stderr[-2000:]  # the rank's own status, as a shell
    report = json.loads((out / "report.json").read_text())
    failed = [f for f in report["findings"] if f["kind"] == "run-failed"]
    assert failed and failed[0]["evidence"]["first_failed_rank"] == 1
    assert "SIGSEGV" in failed[0]["message"] and "SIGKILL" not in failed[0]["message"]
    assert failed[0]["cause"] == "signal"
    footer = list(read_events(out / "ranks" / "rank-00001.jsonl"))[-1]
    assert footer["type"] == "exit" and footer["by"] == "launcher"
