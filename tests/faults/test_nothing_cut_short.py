"""Nothing a user's program writes is cut short by syncscope profile.

A non-daemon thread still working after the script's end (writing the final checkpoint)
is waited for while it computes, at most a documented grace, said in one line; a hung job
is stopped with each rank's whole process group, so no worker a rank started lives on."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers.hostile import profile_script

CHECKPOINT_AFTER_THE_END = textwrap.dedent(
    """
    import os, threading, time
    import torch, torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    OUT = OUT_DIR


    def save():  # 10 s of work after the script's end, a chunk written each second
        with open(f"{OUT}/ckpt-{rank}.bin", "wb") as fh:
            for i in range(10):
                end = time.monotonic() + 1.0
                while time.monotonic() < end:
                    pass
                fh.write(b"x" * 1000)
                fh.flush()
        os.rename(f"{OUT}/ckpt-{rank}.bin", f"{OUT}/ckpt-{rank}.done")


    t = torch.ones(2)
    dist.all_reduce(t)
    dist.destroy_process_group()
    threading.Thread(target=save, name="checkpoint").start()
    """
)


@pytest.mark.slow
def test_a_thread_writing_the_last_checkpoint_is_waited_for(tmp_path: Path) -> None:
    saved = tmp_path / "saved"
    saved.mkdir()
    source = CHECKPOINT_AFTER_THE_END.replace("OUT_DIR", repr(str(saved)))
    done, _ = profile_script(tmp_path, "train.py", source, "--hang-timeout", "4")
    assert done.returncode == 0, done.stderr[-3000:]
    # THEN both checkpoints are whole: nothing was stopped while it wrote
    for rank in (0, 1):
        assert (saved / f"ckpt-{rank}.done").stat().st_size == 10_000, sorted(saved.iterdir())
    # AND one line says syncscope waits, and for how long at most
    (line,) = [ln for ln in done.stderr.splitlines() if "non-daemon thread(s) still work" in ln]
    assert line.startswith("syncscope: rank(s) 0, 1 ended the script") and "at most 600 s" in line
    assert "SIGTERM" not in done.stderr and "syncscope stopped the process" not in done.stderr


STUCK_POOL_WORKER = textwrap.dedent(
    """
    import os, time
    import concurrent.futures as cf
    import torch, torch.distributed as dist


    def stuck(path):
        with open(path, "w") as fh:
            fh.write(str(os.getpid()))
        time.sleep(600)


    if __name__ == "__main__":
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        pool = cf.ProcessPoolExecutor(1)
        pool.submit(stuck, os.path.join(OUT_DIR, f"worker-{rank}.pid"))
        t = torch.ones(2)
        if rank == 0:
            dist.all_reduce(t)  # rank 1 skips it: the job hangs
        dist.barrier()
    """
)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.mark.slow
def test_stopping_a_hung_job_leaves_no_worker_of_a_rank_behind(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    source = STUCK_POOL_WORKER.replace("OUT_DIR", repr(str(pids)))
    done, _ = profile_script(tmp_path, "train.py", source, "--hang-timeout", "4")
    assert done.returncode == 1 and "no rank made progress for 4 s" in done.stderr
    workers = [int(path.read_text()) for path in sorted(pids.glob("worker-*.pid"))]
    assert len(workers) == 2
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [pid for pid in workers if _alive(pid)]
    for pid in left:  # never leave them to the machine
        os.kill(pid, 9)
    assert left == [], "a rank's pool worker outlived the stopped job"
