"""Rough edges of issue 28 (third round): a full disk at report time, the test API's root
cause, a job kept alive by the script's own thread, a rendezvous waiting for a node."""

from __future__ import annotations

import errno
import importlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import IO, Any

import pytest

from syncscope.launch.job import report_run
from tests.helpers.hostile import write_run

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


# --- a full disk when profile writes its reports ---------------------------------------------


def _disk_full(*_: Any) -> Any:
    def write(_run: Any, _findings: Any, out: IO[bytes]) -> None:
        out.write(b"{")
        raise OSError(errno.ENOSPC, "No space left on device")

    return write


@pytest.mark.parametrize("quiet", [False, True])
def test_full_disk_at_report_prints_the_summary_then_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], quiet: bool
) -> None:
    run_dir = write_run(tmp_path)
    monkeypatch.setattr("syncscope.render.outputs.writer", _disk_full)
    status = report_run(run_dir, 0, None, "error", quiet)
    out, err = capsys.readouterr()
    assert status == 2
    assert "world size 2" in out and "verdict: clean" in out  # the summary, even with -q
    last = err.strip().splitlines()[-1]
    assert last.startswith("syncscope: error: cannot write ")
    assert "No space left on device" in last
    assert "2 window(s) on 2 rank(s)" in last
    assert f"syncscope report {run_dir}" in last
    assert "Traceback" not in err
    assert sorted(p.name for p in run_dir.iterdir()) == ["meta.json", "ranks"]  # no half file


def test_full_disk_keeps_the_jobs_own_failure_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = write_run(tmp_path)
    monkeypatch.setattr("syncscope.render.outputs.writer", _disk_full)
    assert report_run(run_dir, 7, 1, "error", True) == 7
    assert "No space left on device" in capsys.readouterr().err


# --- spawn: a rank's own exit code before a peer's "Connection reset by peer" ----------------

SPAWN = importlib.import_module("syncscope.testing.spawn")  # the package's name is the function
RESET = "[gloo/transport/tcp/pair.cc:553] Connection reset by peer [127.0.0.1]:2998"


class _Proc:
    """A finished (or running) rank process as _collect sees it."""

    def __init__(self, exitcode: int | None) -> None:
        self.exitcode = exitcode


def _message(rank: int, exc: BaseException) -> tuple[int, str, bytes | None, str]:
    """What a rank sends when ``exc`` ends its function (spawn's own encoding)."""
    data, text = SPAWN._error_payload(exc)
    return rank, "error", data, text


def _collect(procs: list[_Proc], messages: list[Any]) -> BaseException:
    import queue
    import time

    results: queue.Queue[Any] = queue.Queue()
    for message in messages:
        results.put(message)
    with pytest.raises(Exception) as info:
        SPAWN._collect(procs, results, {}, 30.0, time.monotonic() + 30.0)
    return info.value


def _notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", []))


def test_spawn_os_exit_9_comes_before_the_peers_connection_reset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(SPAWN, "_GRACE_S", 0.05)
    # rank 0 called os._exit(9) (no message); rank 1 then saw its connection reset
    exc = _collect([_Proc(9), _Proc(1)], [_message(1, RuntimeError(RESET))])
    assert isinstance(exc, RuntimeError)
    assert str(exc).startswith("spawn: rank 0 exited with code 9 without reporting")
    assert "then rank 1 of 2 failed (its connection to a failed rank broke)" in _notes(exc)
    assert "Connection reset by peer" in _notes(exc)


def test_spawn_sys_exit_9_is_named_with_its_code_whatever_arrives_first() -> None:
    exc = _collect(
        [_Proc(1), _Proc(1)], [_message(1, RuntimeError(RESET)), _message(0, SystemExit(9))]
    )
    assert str(exc) == "spawn: rank 0 exited with code 9 (sys.exit(9) in the function)"
    assert "raised on rank 0 of 2" in _notes(exc)
    assert "then rank 1 of 2 failed (its connection" in _notes(exc)


def test_spawn_a_ranks_own_error_stays_the_root_cause() -> None:
    exc = _collect(
        [_Proc(1), _Proc(1), _Proc(1)],
        [
            _message(2, RuntimeError(RESET)),
            _message(1, ValueError("bad batch")),
            _message(0, KeyError("k")),
        ],
    )
    assert isinstance(exc, ValueError) and str(exc) == "bad batch"  # the first own error
    notes = _notes(exc)
    assert notes.index("then rank 0 of 3 failed: KeyError") < notes.index("then rank 2 of 3")


def test_spawn_a_rank_killed_by_a_signal_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SPAWN, "_GRACE_S", 0.05)
    exc = _collect([_Proc(None), _Proc(-9)], [])
    assert str(exc).startswith("spawn: rank 1 was killed by signal SIGKILL without reporting")


def exit_9_on_rank_0(how: str) -> int:
    """Rank 0 exits with code 9 while rank 1 waits for it in an all_reduce."""
    import os
    import sys
    import time

    import torch
    import torch.distributed as dist

    if dist.get_rank() == 0:
        time.sleep(0.5)
        if how == "os._exit":
            os._exit(9)
        sys.exit(9)
    dist.all_reduce(torch.ones(1))
    return 1


@pytest.mark.slow
@pytest.mark.parametrize("how", ["os._exit", "sys.exit"])
def test_spawn_reports_rank_0s_exit_9_not_rank_1s_broken_connection(how: str) -> None:
    import multiprocessing

    from syncscope.testing import spawn

    with pytest.raises(RuntimeError) as info:
        spawn(exit_9_on_rank_0, world_size=2, args=(how,), timeout=60)
    assert str(info.value).startswith("spawn: rank 0 exited with code 9")
    assert "then rank 1 of 2 failed" in _notes(info.value)
    assert not multiprocessing.active_children()


# --- a non-daemon thread of the script's keeps the ranks alive after the script's end --------


def _ended_rank(run_dir: Path, rank: int, reason: str = "finished") -> Path:
    """A rank file whose script has ended, written by a process that is still alive (this one)."""
    import orjson

    from tests.helpers.hostile import run_events

    events = run_events(rank)
    events[0]["pid"] = os.getpid()
    events[-1]["reason"] = reason
    path = run_dir / "ranks" / f"rank-{rank:05d}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    return path


def _monitor(run_dir: Path, stopped: list[Path]) -> Any:
    from syncscope.launch.torchrun import Monitor

    monitor = Monitor(run_dir, hang_timeout=0.3, poll_s=0.05, expected_ranks=2)
    monitor._stop_workers = stopped.extend  # type: ignore[method-assign]
    return monitor


def test_monitor_stops_ranks_that_outlive_their_scripts_end(tmp_path: Path) -> None:
    paths = [_ended_rank(tmp_path, r) for r in (0, 1)]
    stopped: list[Path] = []
    monitor = _monitor(tmp_path, stopped)
    monitor.start()
    monitor.join(timeout=10)
    assert not monitor.is_alive()
    assert monitor.lingering == (0, 1) and not monitor.hung
    assert sorted(stopped) == paths


def test_monitor_leaves_a_rank_running_on_after_a_bounded_capture(tmp_path: Path) -> None:
    _ended_rank(tmp_path, 0, "capture complete: windows 0-1; the job runs on without hooks")
    _ended_rank(tmp_path, 1, "capture complete: windows 0-1; the job runs on without hooks")
    stopped: list[Path] = []
    monitor = _monitor(tmp_path, stopped)
    monitor.start()
    monitor.join(timeout=1.5)  # five hang timeouts
    assert monitor.is_alive()  # still watching: the job trains on without hooks
    monitor.stop()
    monitor.join(timeout=5)
    assert monitor.lingering == () and stopped == []


def test_a_signal_after_the_scripts_end_names_the_threads_left(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal
    import threading

    from syncscope.launch import attach

    release = threading.Event()
    thread = threading.Thread(target=release.wait, name="uploader\x1b[2J")
    thread.start()
    try:
        attach._name_lingering_threads(signal.SIGTERM)  # the script still runs: nothing said
        assert capsys.readouterr().err == ""
        monkeypatch.setattr(attach, "_SCRIPT_ENDED", threading.Event())
        attach._SCRIPT_ENDED.set()
        monkeypatch.setenv("RANK", "1")
        attach._name_lingering_threads(signal.SIGTERM)
    finally:
        release.set()
        thread.join()
    err = capsys.readouterr().err
    assert err.startswith("syncscope: SIGTERM after the script ended (rank 1): its non-daemon")
    assert "'uploader" in err and "\x1b" not in err


LINGER = textwrap.dedent(
    """
    import threading, time
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
    threading.Thread(target=time.sleep, args=(3600,), name="uploader").start()
    """
)


@pytest.mark.slow
def test_profile_says_a_non_daemon_thread_kept_the_ranks_alive(tmp_path: Path) -> None:
    script = tmp_path / "linger.py"
    script.write_text(LINGER)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "syncscope", "profile", "-q", "--nproc-per-node", "2"]
    start = time.monotonic()
    done = subprocess.run(
        # long enough that a rank slow to start on a loaded machine is not taken for a hang
        [*command, "--hang-timeout", "15", "--out", str(out), str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    took = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    assert "rank(s) 0-1 finished the script (every window is captured" in done.stderr
    assert "a non-daemon thread the script started keeps Python alive" in done.stderr
    assert "its non-daemon thread(s) 'uploader' kept the process alive" in done.stderr
    report = json.loads((out / "report.json").read_text())
    assert [len(rank["windows"]) for rank in report["ranks"]] == [3, 3]
    assert took < 90


# --- a multi-node rendezvous waiting for a node that never comes -----------------------------


class _Handler:
    """A c10d rendezvous handler as torch's DynamicRendezvousHandler exposes its state."""

    def __init__(self, joined: int, needed: int = 2, join_s: float = 600.0) -> None:
        from datetime import timedelta
        from types import SimpleNamespace

        self._state_holder = SimpleNamespace(
            state=SimpleNamespace(participants=dict.fromkeys(range(joined), 0))
        )
        self.settings = SimpleNamespace(
            min_nodes=needed, timeout=SimpleNamespace(join=timedelta(seconds=join_s))
        )


C10D = {"nnodes": "2", "rdzv_backend": "c10d", "rdzv_endpoint": "node0:29400"}


def test_rendezvous_watch_says_how_many_nodes_joined(capsys: pytest.CaptureFixture[str]) -> None:
    from syncscope.launch.rendezvous import RendezvousWatch

    watch = RendezvousWatch(C10D)
    watch.handlers.append(_Handler(1))
    watch(2.0)  # too early: ranks may just be starting
    assert capsys.readouterr().err == ""
    watch(5.0)
    watch(30.0)  # the same count within a minute: said once
    assert capsys.readouterr().err == (
        "syncscope: waiting for the rendezvous at node0:29400 (c10d): 1 of 2 node(s) joined "
        "after 5 s; no rank starts until every node has joined (torch gives up after 600 s: "
        "--rdzv-conf join_timeout=SECONDS)\n"
    )
    watch(66.0)  # a minute later: again
    assert "1 of 2 node(s) joined after 66 s" in capsys.readouterr().err
    error = watch.explain("RendezvousTimeoutError")
    assert (
        error == "RendezvousTimeoutError: 1 of 2 node(s) had joined the rendezvous at node0:29400"
    )
    watch.handlers.append(_Handler(2))
    watch(67.0)  # every node is in: the ranks are starting
    assert capsys.readouterr().err == ""
    assert watch.explain("RendezvousClosedError") == "RendezvousClosedError"  # not a wait


def test_rendezvous_watch_without_state(capsys: pytest.CaptureFixture[str]) -> None:
    from syncscope.launch.rendezvous import RendezvousWatch

    RendezvousWatch({"nproc_per_node": "2"})(30.0)  # one node: slow ranks, nothing to say
    assert capsys.readouterr().err == ""
    static = {"nnodes": "2", "master_addr": "10.0.0.1", "master_port": "29500"}
    RendezvousWatch(static)(6.0)
    err = capsys.readouterr().err
    assert err.startswith("syncscope: waiting for the rendezvous at 10.0.0.1:29500 (static): ")
    assert "no rank has started after 6 s; every node of --nnodes 2 must start" in err


def test_monitor_asks_the_rendezvous_watch_while_no_rank_file_exists(tmp_path: Path) -> None:
    from syncscope.launch.torchrun import Monitor

    waited: list[float] = []
    monitor = Monitor(tmp_path, 0.0, poll_s=0.02, on_waiting=waited.append)
    monitor.start()
    time.sleep(0.3)
    _ended_rank(tmp_path, 0)
    time.sleep(0.3)
    monitor.stop()
    monitor.join(timeout=5)
    assert len(waited) >= 3 and waited == sorted(waited)
    assert waited[-1] < 0.5  # not asked once a rank file exists


@pytest.mark.slow
def test_profile_says_what_a_two_node_rendezvous_waits_for(tmp_path: Path) -> None:
    import socket

    script = tmp_path / "linger.py"
    script.write_text(LINGER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "syncscope", "profile", "-q", "--nnodes", "2"]
    command += ["--node-rank", "0", "--rdzv-backend", "c10d"]
    command += ["--rdzv-endpoint", f"localhost:{port}", "--rdzv-conf", "join_timeout=8"]
    start = time.monotonic()
    done = subprocess.run(
        [*command, "--out", str(tmp_path / "run"), str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    took = time.monotonic() - start
    assert f"waiting for the rendezvous at localhost:{port} (c10d): 1 of 2 node(s) joined" in (
        done.stderr
    )
    assert "torch gives up after 8 s" in done.stderr
    assert (
        "the launcher stopped: RendezvousTimeoutError: 1 of 2 node(s) had joined the rendezvous"
        in done.stderr
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert took < 60
