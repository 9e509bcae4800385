"""Hang detection counts the work a rank hands off, and names the waits DDP's backward makes.

A rank whose main thread waits for work it handed off (a thread, a subprocess, a process
pool, DataLoader workers computing the first batch) computes: the job is not hung while that
work uses CPU. A rank idle inside a backward waits for DDP's gradient all-reduce: while
another rank computes, that wait is named like any other."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.helpers.hostile import profile_script

HANDS_OFF = textwrap.dedent(
    """
    import subprocess, sys, threading, time
    import concurrent.futures as cf
    import torch, torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset

    SECONDS = 6  # each phase: longer than --hang-timeout


    def compute(seconds=SECONDS):
        end, n = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            n += 1
        return n


    class Slow(Dataset):
        def __len__(self):
            return 1

        def __getitem__(self, i):
            compute()
            return torch.ones(2)


    if __name__ == "__main__":
        dist.init_process_group("gloo")
        if dist.get_rank() == 0:  # its main thread waits each time; the work computes
            worker = threading.Thread(target=compute)
            worker.start()
            worker.join()
            code = "import time\\nend = time.monotonic() + 6\\nwhile time.monotonic() < end: pass"
            subprocess.run([sys.executable, "-c", code], check=True)
            with cf.ProcessPoolExecutor(1) as pool:
                pool.submit(compute).result()
            for batch in DataLoader(Slow(), num_workers=1):
                pass
        t = torch.ones(2)
        dist.all_reduce(t)
        assert t.tolist() == [2.0, 2.0]
    """
)


def _findings(out: Path) -> list[dict[str, Any]]:
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    findings: list[dict[str, Any]] = report["findings"]
    return findings


@pytest.mark.slow
def test_work_in_threads_children_pools_and_dataloader_workers_is_progress(
    tmp_path: Path,
) -> None:
    done, out = profile_script(tmp_path, "train.py", HANDS_OFF, "--hang-timeout", "4")
    # THEN the job runs to its end (24 s of work, each 6 s piece past the 4 s timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no rank made progress" not in done.stderr
    assert not json.loads((out / "meta.json").read_text())["hung"]
    findings = _findings(out)
    kinds = [f["kind"] for f in findings]
    assert "hang" not in kinds and "collective-mismatch" not in kinds, kinds
    # AND rank 1's wait for rank 0 is named (rank 0 ran, in its threads or children)
    (wait,) = [f for f in findings if f["kind"] == "waited-for-rank"]
    assert wait["ranks"] == [0] and wait["evidence"]["waiting_ranks"] == [1]
    assert wait["cost"]["longest_wait_s"] >= 15, wait["cost"]


DDP_WAIT = textwrap.dedent(
    """
    import time
    import torch, torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(nn.Linear(4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)


    def compute(seconds):
        end, n = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            n += 1


    for step in range(3):
        loss = model(torch.randn(2, 4)).sum()
        if step == 1 and rank == 1:
            compute(12)
        loss.backward()
        opt.step()
        opt.zero_grad()
    """
)


@pytest.mark.slow
def test_a_rank_waiting_in_ddps_backward_all_reduce_is_a_named_wait(tmp_path: Path) -> None:
    done, out = profile_script(tmp_path, "train.py", DDP_WAIT, "--hang-timeout", "60")
    assert done.returncode == 0, done.stderr[-3000:]
    (wait,) = [f for f in _findings(out) if f["kind"] == "waited-for-rank"]
    assert wait["ranks"] == [1] and wait["evidence"]["waiting_ranks"] == [0]
    assert 7 <= wait["cost"]["longest_wait_s"] <= 14, wait["cost"]
    assert "rank 0 waiting in backward at " in wait["message"]
    assert wait["message"].endswith("train.py:23"), wait["message"]  # loss.backward()


# --- the heartbeat and the monitor, without a job ---------------------------------------


def _beat(run_dir: Path, rank: int, **fields: Any) -> None:
    path = run_dir / "beats" / f"rank-{rank:05d}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    beat = {"pid": 1000 + rank, "rank": rank, "state": "running", "where": "t.py:1", "call": ""}
    partial = path.with_name(f".{path.name}.partial")  # whole, then renamed: as the ranks do
    partial.write_bytes(orjson.dumps({**beat, "pg": True, **fields}))
    partial.replace(path)


def test_a_rank_whose_handed_off_work_computes_is_progressing(tmp_path: Path) -> None:
    from syncscope.launch.watch import Beats

    beats = Beats(tmp_path)
    live = {0: (1000, "elsewhere")}  # not this host: the beats alone say
    _beat(tmp_path, 0, seq=1, cpu=1.0, work_cpu=0.0, where="t.py:7")
    beats.read(live, now=0.0)
    _beat(tmp_path, 0, seq=2, cpu=1.0, work_cpu=0.9, where="t.py:7")  # a worker computed
    view = beats.read(live, now=1.0)[0]
    assert not view.busy and view.working and view.progressing
    assert view.text() == "running at t.py:7 (in its threads or child processes)"
    _beat(tmp_path, 0, seq=3, cpu=1.0, work_cpu=0.9001, where="t.py:7")  # nothing computed
    idle = beats.read(live, now=2.0)[0]
    assert not idle.progressing and idle.text().startswith("idle at t.py:7")
    _beat(tmp_path, 0, seq=4, cpu=1.0, work_cpu=0.9, call="backward", where="t.py:9")
    assert beats.read(live, now=3.0)[0].text() == "waiting in backward at t.py:9"


def _counts_up(clock: Any, since: float, seconds: float = 20.0) -> float:
    """Read ``clock`` until it counts 0.1 s of CPU past ``since`` (a loaded machine gives a
    spinning thread a fraction of a core); what it read last."""
    import time

    deadline = time.monotonic() + seconds
    value: float = clock.read()
    while value - since < 0.1 and time.monotonic() < deadline:
        time.sleep(0.05)
        value = clock.read()
    return value


def test_the_work_clock_counts_a_thread_and_a_child_process() -> None:
    import os
    import subprocess
    import sys
    import threading

    from syncscope.capture.heartbeat import WorkClock

    clock = WorkClock(os.getpid())
    start = clock.read()
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    thread = threading.Thread(target=spin)
    thread.start()
    try:
        after_thread = _counts_up(clock, start)  # read while it runs (new: from zero)
    finally:
        stop.set()
        thread.join()
    assert after_thread - start >= 0.1
    code = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        during = _counts_up(clock, after_thread)
    finally:
        child.kill()
        child.wait()
    assert during - after_thread >= 0.1  # the child's CPU, while it runs
