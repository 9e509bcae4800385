"""Hang detection tells a slow rank from a stuck one.

The monitor judged progress on the rank files and, for ranks that had written only their
header, on their process's CPU. So a healthy job whose rank 0 ran a long CPU-bound phase
(an evaluation) while rank 1 waited in a barrier was killed as hung (``--hang-timeout 8``),
with a false collective-mismatch; and start-up hangs were never caught: a rank that
slept before ``init_process_group``, or a script that set ``WORLD_SIZE`` itself, left its
ranks in the store for 30 minutes, because torch's and syncscope's own threads gave the
waiting processes CPU ticks. Now each rank's heartbeat says what its *main thread* does
(waiting in torch.distributed, or running, and whether it computes), the job hangs only
when no rank computes and no file grows, the report names the waits, and a job that never
reaches its process group is stopped and reported as such."""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.helpers import hostile as h
from tests.helpers.hostile import profile_script

# --- end to end (each of the first three fails on the code before: see the commit) ---------

EVALUATION = textwrap.dedent(
    """
    import time
    import torch, torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(nn.Linear(4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)


    def evaluate(seconds):
        end, n = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            n += 1  # pure Python: no event, no collective
        return n


    for step in range(3):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        if step == 1:
            if rank == 0:
                evaluate(15)
            dist.barrier()
    """
)


def _report(out: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    return report


@pytest.mark.slow
def test_a_rank_computing_while_the_other_waits_is_not_hung(tmp_path: Path) -> None:
    done, out = profile_script(tmp_path, "evaluate.py", EVALUATION, "--hang-timeout", "5")
    # THEN the job runs to its end: no hang, no false collective-mismatch
    assert done.returncode == 0, done.stderr[-3000:]
    report = _report(out)
    kinds = [f["kind"] for f in report["findings"]]
    assert "hang" not in kinds and "collective-mismatch" not in kinds, kinds
    assert not json.loads((out / "meta.json").read_text())["hung"]
    for rank in report["ranks"]:
        assert [w["index"] for w in rank["windows"] if w["complete"]] == [0, 1, 2]
    # AND the report says rank 1 waited for rank 0, where each was, and for how long
    (wait,) = [f for f in report["findings"] if f["kind"] == "waited-for-rank"]
    assert wait["severity"] == "info" and wait["ranks"] == [0]
    assert wait["evidence"]["waiting_ranks"] == [1]
    assert 8 <= wait["cost"]["longest_wait_s"] <= 20
    assert (
        "rank(s) 1 waited up to" in wait["message"]
        and "for rank(s) 0 (rank 0 running at " in (wait["message"])
    )
    assert re.search(r"evaluate\.py:1[56]\)", wait["message"])  # the evaluation's loop
    assert re.search(r"rank 1 waiting in barrier at \S+evaluate\.py:27$", wait["message"])


BACKGROUND = """
def background():  # a thread of the job's own (logging, prefetching): it uses some CPU
    while True:
        sum(range(20000))
        time.sleep(0.02)


threading.Thread(target=background, daemon=True).start()
"""

SLEEPS_BEFORE_INIT = textwrap.dedent(
    """
    import os, threading, time
    import torch.distributed as dist

    if os.environ["RANK"] == "1":
        time.sleep(600)
    dist.init_process_group("gloo")
    dist.barrier()
    """
).replace("import torch.distributed as dist\n", "import torch.distributed as dist\n" + BACKGROUND)

OVERRIDES_ENVIRONMENT = textwrap.dedent(
    """
    import os, threading, time
    import torch.distributed as dist

    os.environ[NAME] = VALUE  # not the launcher's
    dist.init_process_group("gloo")
    dist.barrier()
    """
).replace("import torch.distributed as dist\n", "import torch.distributed as dist\n" + BACKGROUND)


def _start_up_hang(tmp_path: Path, source: str) -> tuple[dict[str, Any], float]:
    start = time.monotonic()
    done, out = profile_script(tmp_path, "train.py", source, "--hang-timeout", "5")
    took = time.monotonic() - start
    assert done.returncode == 1, done.stderr[-3000:]
    assert "the job never reached its process group: no rank made progress for 5 s" in (done.stderr)
    (finding,) = [f for f in _report(out)["findings"] if f["kind"] == "hang"]
    assert finding["cause"] == "start-up"
    assert finding["message"].startswith("the job never reached its process group")
    return finding, took


@pytest.mark.slow
def test_a_rank_sleeping_before_init_process_group_is_a_start_up_hang(tmp_path: Path) -> None:
    finding, took = _start_up_hang(tmp_path, SLEEPS_BEFORE_INIT)
    per_rank = finding["evidence"]["per_rank"]
    assert per_rank["1"].startswith("idle at ") and per_rank["1"].split(" (")[0].endswith(
        "train.py:14"
    )  # the sleep
    assert per_rank["0"].startswith("waiting in init_process_group at ")
    assert "train.py:15" in per_rank["0"]
    assert took < 60  # start-up (seconds), 5 s, the stop: not the 600 s sleep


@pytest.mark.slow
@pytest.mark.parametrize(("name", "value"), [("WORLD_SIZE", "3"), ("MASTER_PORT", "1")])
def test_a_script_overriding_the_launchers_environment_is_a_start_up_hang(
    tmp_path: Path, name: str, value: str
) -> None:
    source = OVERRIDES_ENVIRONMENT.replace("NAME", repr(name)).replace("VALUE", repr(value))
    finding, took = _start_up_hang(tmp_path, source)
    for rank in ("0", "1"):
        text = finding["evidence"]["per_rank"][rank]
        assert text.startswith("waiting in init_process_group at ") and "train.py:14" in text
    assert took < 60  # not the store's 30 minutes (the process's CPU ticks: its thread's)


SKIPS_ALL_REDUCE = textwrap.dedent(
    """
    import torch, torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(3)
    dist.all_reduce(t)
    if dist.get_rank() == 0:
        dist.all_reduce(t)  # rank 1 skips it and waits in the barrier: neither returns
    dist.barrier()
    """
)


@pytest.mark.slow
def test_a_hang_after_start_up_is_still_stopped_and_names_each_ranks_call(
    tmp_path: Path,
) -> None:
    start = time.monotonic()
    done, out = profile_script(tmp_path, "train.py", SKIPS_ALL_REDUCE, "--hang-timeout", "4")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "no rank made progress for 4 s" in done.stderr
    assert "never reached its process group" not in done.stderr
    hang = next(f for f in _report(out)["findings"] if f["kind"] == "hang")
    assert hang["cause"] == "no-progress"
    threads = hang["evidence"]["main_threads"]
    assert threads["0"].startswith("waiting in all_reduce at ") and "train.py:8" in threads["0"]
    assert threads["1"].startswith("waiting in barrier at ") and "train.py:9" in threads["1"]
    assert time.monotonic() - start < 90


# --- the monitor's judgement, without processes ----------------------------------------------


def _beat(run_dir: Path, rank: int, **fields: Any) -> None:
    path = run_dir / "beats" / f"rank-{rank:05d}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    beat = {"pid": 1000 + rank, "rank": rank, "state": "running", "where": "t.py:1", "call": ""}
    partial = path.with_name(f".{path.name}.partial")  # whole, then renamed: as the ranks do
    partial.write_bytes(orjson.dumps({**beat, "pg": True, **fields}))
    partial.replace(path)


def test_beats_say_which_rank_computes(tmp_path: Path) -> None:
    from syncscope.launch.watch import Beats

    run_dir = tmp_path
    beats = Beats(run_dir)
    live = {0: (1000, "elsewhere"), 1: (1001, "elsewhere")}  # not this host: no /proc
    _beat(run_dir, 0, seq=1, cpu=1.0)
    _beat(run_dir, 1, seq=1, cpu=1.0, state="waiting", call="barrier", where="t.py:9")
    first = beats.read(live, now=0.0)
    assert not first[0].busy and first[1].state == "waiting"  # nothing to compare with yet
    _beat(run_dir, 0, seq=2, cpu=1.9, where="eval.py:17")
    _beat(run_dir, 1, seq=2, cpu=1.0001, state="waiting", call="barrier", where="t.py:9")
    views = beats.read(live, now=1.0)
    assert views[0].busy and views[0].text() == "running at eval.py:17"
    assert not views[1].busy and views[1].text() == "waiting in barrier at t.py:9"
    _beat(run_dir, 0, seq=3, cpu=1.9001, where="t.py:5")  # a sleep: no CPU
    assert beats.read(live, now=2.0)[0].text() == "idle at t.py:5 (its main thread used no CPU)"
    stale = beats.read(live, now=10.0)  # no beat for 8 s: /proc, which cannot say here
    assert stale[0].state == "" and not stale[0].busy
    assert stale[0].text() == "idle or blocked (no heartbeat)"
    _beat(run_dir, 1, seq=3, pid=555, state="running", cpu=50.0)  # an earlier attempt's pid
    assert beats.read(live, now=10.5)[1].state == ""


def test_waits_are_kept_only_when_another_rank_computed() -> None:
    from syncscope.launch.watch import MainThread, Waits

    waits = Waits(min_wait_s=3.0)
    rank0 = MainThread(0, 10, "running", True, "eval.py:17", "", True)
    rank1 = MainThread(1, 11, "waiting", False, "t.py:9", "barrier", True)
    for second in range(6):
        waits.observe({0: rank0, 1: rank1}, set(), float(second))
    waits.observe({0: rank0, 1: rank1}, {1}, 6.0)  # rank 1's file grew: released
    assert waits.episodes == [
        {
            "rank": 1,
            "for": [0],
            "seconds": 5.0,
            "since": waits.episodes[0]["since"],
            "waiting": "waiting in barrier at t.py:9",
            "running": {"0": "eval.py:17"},
        }
    ]
    idle0 = MainThread(0, 10, "running", False, "t.py:5", "", True)  # a sleep, not a compute
    for second in range(10, 20):
        waits.observe({0: idle0, 1: rank1}, set(), float(second))
    waits.observe({0: rank0, 1: rank1}, set(), 20.0)
    waits.observe({0: rank0, 1: rank1}, set(), 21.0)  # 1 s: too short to report
    waits.close()
    assert len(waits.episodes) == 1


def test_hang_state_says_start_up_only_when_no_rank_has_its_group() -> None:
    from syncscope.launch.watch import MainThread, hang_state

    sleeping = MainThread(1, 11, "running", False, "t.py:5", "", False)
    in_init = MainThread(0, 10, "waiting", False, "t.py:6", "init_process_group", False)
    state = hang_state({0: in_init, 1: sleeping})
    assert state["start_up"] and state["main_threads"]["0"].startswith("waiting in init_")
    assert not hang_state({0: in_init, 1: MainThread(1, 11)})["start_up"]  # 1 unknown
    assert not hang_state({})["start_up"]


def _header(run_dir: Path, rank: int, pid: int) -> None:
    path = run_dir / "ranks" / f"rank-{rank:05d}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {"type": "header", "rank": rank, "pid": pid, "host": "elsewhere"}
    path.write_bytes(orjson.dumps(header) + b"\n")


def test_the_monitor_waits_for_a_computing_rank_and_stops_a_stuck_job(tmp_path: Path) -> None:
    from syncscope.launch.torchrun import Monitor

    for rank in (0, 1):
        _header(tmp_path, rank, 1000 + rank)
    computing = threading.Event()
    computing.set()
    done = threading.Event()

    def beat() -> None:  # rank 0 computes while `computing` is set; rank 1 waits throughout
        seq, cpu = 0, 0.0
        while not done.wait(0.05):
            seq += 1
            cpu += 0.1 if computing.is_set() else 0.0
            _beat(tmp_path, 0, seq=seq, cpu=cpu, pg=True)
            _beat(tmp_path, 1, seq=seq, cpu=1.0, state="waiting", call="all_reduce", pg=True)

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    stopped: list[Path] = []
    monitor = Monitor(tmp_path, hang_timeout=0.4, poll_s=0.05)
    monitor._stop_workers = stopped.extend  # type: ignore[method-assign]
    monitor.waits.min_wait_s = 0.5
    monitor.start()
    try:
        monitor.join(timeout=1.6)  # four hang timeouts of rank 0 computing
        assert monitor.is_alive() and not monitor.hung and stopped == []
        computing.clear()  # rank 0 now waits too (idle): the job is stuck
        monitor.join(timeout=5)
        assert not monitor.is_alive() and monitor.hung and len(stopped) == 2
        assert monitor.hang["start_up"] is False
        assert monitor.hang["main_threads"]["1"] == "waiting in all_reduce at t.py:1"
        (wait,) = monitor.waits.episodes
        assert wait["rank"] == 1 and wait["for"] == [0] and wait["seconds"] >= 1.0
    finally:
        done.set()
        monitor.stop()
        monitor.join(timeout=5)


# --- the heartbeat in the rank ---------------------------------------------------------------

BLOCKING = """
def all_reduce(tensor):
    return wrapper(tensor)

def wrapper(tensor):
    tensor.wait()
"""


def test_the_heartbeat_reads_the_main_threads_stack(tmp_path: Path) -> None:
    from syncscope.capture.heartbeat import describe

    # a frame in torch.distributed's communication module, called from the script
    fake = str(tmp_path / "site" / "torch" / "distributed" / "distributed_c10d.py")
    space: dict[str, Any] = {}
    exec(compile(BLOCKING, fake, "exec"), space)
    seen: dict[str, str] = {}

    class Tensor:
        def wait(self) -> None:
            seen.update(describe(sys._getframe().f_back))  # from torch's frame inward

    space["all_reduce"](Tensor())  # this test's line is the script's
    assert seen["state"] == "waiting" and seen["call"] == "all_reduce"
    assert seen["where"].startswith(__file__ + ":")
    running = describe(sys._getframe())
    assert running["state"] == "running" and running["call"] == ""
    assert running["where"] == f"{__file__}:{sys._getframe().f_lineno - 2}"


def test_the_heartbeat_writes_its_beat_and_a_forked_child_writes_none(tmp_path: Path) -> None:
    from syncscope.capture.heartbeat import start_heartbeat

    stop = start_heartbeat(tmp_path, 3, interval=0.05)
    try:
        path = tmp_path / "beats" / "rank-00003.json"
        deadline = time.monotonic() + 5
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        beat = orjson.loads(path.read_bytes())
        assert beat["pid"] == os.getpid() and beat["rank"] == 3 and beat["state"] == "running"
        assert isinstance(beat["cpu"], float) and beat["pg"] is False
        pid = os.fork()
        if pid == 0:  # the child: the parent's thread is not here; it writes nothing
            time.sleep(0.3)
            os._exit(0)
        os.waitpid(pid, 0)
        assert orjson.loads(path.read_bytes())["pid"] == os.getpid()
    finally:
        stop.set()


# --- the report ------------------------------------------------------------------------------


def test_the_report_names_waits_and_start_up_hangs(tmp_path: Path) -> None:
    from syncscope.analysis.hangs import hang, waited_for_rank
    from syncscope.load.runs import load_run

    waits = [
        {"rank": 1, "for": [0], "seconds": 42.0, "since": 1.0,
         "waiting": "waiting in barrier at train.py:20", "running": {"0": "eval.py:17"}},
        {"rank": 2, "for": [0], "seconds": 40.5, "since": 1.0,
         "waiting": "waiting in barrier at train.py:20", "running": {"0": "eval.py:17"}},
        {"rank": "bad"},
    ]  # fmt: skip
    meta = h.meta(waits=waits)
    (wait,) = waited_for_rank(load_run(h.write_run(tmp_path / "a", meta_data=meta)))
    assert wait.message == (
        "rank(s) 1-2 waited up to 42 s for rank(s) 0 (rank 0 running at eval.py:17); rank 1 "
        "waiting in barrier at train.py:20; 2 waits, 82.5 s in all"
    )
    assert wait.cost == {"waited_s": 82.5, "longest_wait_s": 42.0}
    threads = {"0": "waiting in init_process_group at train.py:7", "1": "idle at train.py:5"}
    meta = h.meta(hung=True, hang_timeout_s=5.0, hang={"start_up": True, "main_threads": threads})
    (found,) = hang(load_run(h.write_run(tmp_path / "b", meta_data=meta)))
    assert found.cause == "start-up" and found.evidence == {"per_rank": threads}
    assert found.message == (
        "the job never reached its process group: no progress for 5 s before any rank had "
        "one, and syncscope stopped the job: rank 0 waiting in init_process_group at "
        "train.py:7; rank 1 idle at train.py:5"
    )
