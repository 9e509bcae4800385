"""Ranks that outlive their script's end: the monitor stops them (unless a bounded capture
left them running on by choice), and a signal after the end, or ``profile``'s own summary,
names the non-daemon threads that kept them alive."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


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
