"""The reader's half: torchrun's --max-restarts re-runs every rank's script
and each attempt appends to the same rank file. The last attempt is the job's outcome and is
reported alone, with a note (the earlier ones read as extra, mismatched windows: a false
error, exit 1). The launch half end to end: `profile --max-restarts 1` finishes with exit 0 and
reports the last attempt; its monitor follows each new attempt's rank files (it kept the
first attempt's, so a hang after a restart was never stopped)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.helpers.events import Rank, run_of
from tests.helpers.hostile import profile_script


def test_the_last_attempt_of_a_rank_file_is_read_alone(tmp_path: Path) -> None:
    """Two headers in one rank file: the events after the last one make the rank."""
    from syncscope.load.runs import _last_attempt

    first, second = Rank(0), Rank(0)
    first.window([0, 1], n=2)  # the failed attempt's window
    second.window([1], n=2).finish()
    notes: list[str] = []
    events = _last_attempt([*first.events, *second.events], tmp_path / "rank-00000.jsonl", notes)
    assert events == second.events
    assert notes and "2 attempts of the script" in notes[0]
    run = run_of(Rank(0).window([1], n=2).finish())
    assert [w.grad_syncs for w in run.ranks[0].windows if w.complete] == [1]


# --- the launch half, end to end -------------------------------------------------------------

RESTARTED = textwrap.dedent(
    """
    import os, sys
    import torch, torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(nn.Linear(4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        if attempt == "0" and rank == 1 and step == 2:
            sys.exit(1)
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    """
)


def test_the_monitor_follows_a_restarted_attempts_rank_file(tmp_path: Path) -> None:
    """attach moves the attempt before aside; the monitor reads the new file from its start
    (its pid, not yet exited), so the hang timeout still holds after a restart."""
    from syncscope.launch.torchrun import Monitor

    ranks = tmp_path / "ranks"
    ranks.mkdir()
    path = ranks / "rank-00000.jsonl"
    path.write_bytes(b'{"type":"header","pid":111}\n{"type":"step_end"}\n{"type":"exit"}\n')
    monitor = Monitor(tmp_path, hang_timeout=10)
    monitor._read_new()
    assert monitor._pids[path] == 111 and path in monitor._exited and monitor.steps == 1
    path.rename(tmp_path / "old.jsonl")  # what set_aside_attempt does
    path.write_bytes(b'{"type":"header","pid":222}\n')
    monitor._read_new()
    assert monitor._pids[path] == 222 and path not in monitor._exited and monitor.steps == 0


@pytest.mark.slow
def test_a_restarted_job_finishes_and_reports_its_last_attempt(tmp_path: Path) -> None:
    done, out = profile_script(
        tmp_path, "restarted.py", RESTARTED, "--max-restarts", "1", "--hang-timeout", "60"
    )
    assert done.returncode == 0, done.stderr[-3000:]  # as plain torchrun: the restart succeeded
    assert "restarted 1 time(s)" in done.stderr and str(out / "attempts" / "attempt-0") in (
        done.stderr
    )
    report = json.loads((out / "report.json").read_text())
    assert report["findings"] == []  # no false collective-mismatch from the failed attempt
    for rank in report["ranks"]:
        assert rank["finished"] and rank["exit_status"] == 0
        assert [w["index"] for w in rank["windows"] if w["complete"]] == [0, 1, 2]
    earlier = out / "attempts" / "attempt-0" / "ranks"
    assert sorted(p.name for p in earlier.iterdir()) == ["rank-00000.jsonl", "rank-00001.jsonl"]
    for path in [*earlier.iterdir(), *(out / "ranks").iterdir()]:
        assert path.read_bytes().count(b'"type":"header"') == 1  # one attempt per file
