"""A rank still starting up on a loaded machine is not a hang: its file holds only its header
while it imports torch and builds its model, and the hang clock runs only while no rank's main
thread computes (here without a heartbeat: the main thread's CPU ticks from /proc; a process's
own CPU would not do, its other threads tick while a rank waits in a rendezvous). Found when
``--hang-timeout 3`` stopped a 2-rank job during its imports on a machine with 4 busy
loops."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from syncscope.launch.torchrun import Monitor

BUSY = "while True: pass"
IDLE = "import time; time.sleep(60)"


def _header_only(run_dir: Path, rank: int, pid: int) -> Path:
    path = run_dir / "ranks" / f"rank-{rank:05d}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {"type": "header", "format": "syncscope-events", "version": 2, "rank": rank}
    path.write_bytes(orjson.dumps({**header, "world_size": 1, "pid": pid}) + b"\n")
    return path


@pytest.mark.parametrize(("code", "hung"), [(BUSY, False), (IDLE, True)])
def test_a_rank_busy_starting_up_is_not_hung(tmp_path: Path, code: str, hung: bool) -> None:
    process = subprocess.Popen([sys.executable, "-c", code])
    try:
        _header_only(tmp_path, 0, process.pid)
        stopped: list[Path] = []
        monitor = Monitor(tmp_path, hang_timeout=0.5, poll_s=0.05)
        monitor._stop_workers = stopped.extend  # type: ignore[method-assign]
        monitor.start()
        monitor.join(timeout=2.0)  # four hang timeouts
        # THEN a rank using CPU with nothing written yet is still watched, not stopped;
        # one that sleeps with only its header written is a hang
        assert monitor.hung is hung
        assert monitor.is_alive() is not hung
        monitor.stop()
        monitor.join(timeout=5)
    finally:
        process.kill()
        process.wait()
