"""``syncscope.track()`` used as a careless test would: from two threads at once, the same
object entered twice, a block never exited (``track().__enter__()`` alone)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from syncscope.testing.track import track
from tests.helpers.hostile import tree_env
from tests.helpers.ranks import STEPS, make_ddp, train


@pytest.mark.usefixtures("process_group")
def test_a_block_in_a_second_thread_is_refused_while_one_is_open() -> None:
    """Was: both blocks counted both threads' syncs ([2, 1, 2, 1] where [1, 1, 1] is
    right), and 1 run in 8 never ended. Now the second thread's block is refused at once,
    with why, and the first counts its own work."""
    model = make_ddp()
    opened, tried = threading.Event(), threading.Event()
    refused: list[BaseException] = []

    def second() -> None:
        opened.wait(30)
        try:
            with track():
                train(make_ddp(), mode="no_sync")
        except RuntimeError as exc:
            refused.append(exc)
        finally:
            tried.set()

    thread = threading.Thread(target=second, name="evaluator")
    thread.start()
    with track() as stats:
        opened.set()
        assert tried.wait(30)
        train(model, mode="no_sync")
    thread.join(30)
    assert not thread.is_alive()
    assert stats.grad_syncs_per_window == [1] * STEPS
    assert len(refused) == 1
    assert str(refused[0]).startswith(
        "syncscope.track() is open in another thread ('MainThread'): its hooks see the "
        "whole process"
    )
    with track() as after:  # once the first block has exited, any thread may open one
        train(model, mode="no_sync", steps=1)
    assert after.grad_syncs_per_window == [1]


@pytest.mark.usefixtures("process_group")
def test_one_track_object_entered_again() -> None:
    """Was: AttributeError about '_GeneratorContextManager' on the second ``with``."""
    model = make_ddp()
    block = track()
    with block as first:
        train(model, mode="no_sync", steps=1)
    with block as second:
        train(model, mode="every", steps=1)
    assert first.grad_syncs_per_window == [1]
    assert second.grad_syncs_per_window[0] > 1
    with block, pytest.raises(RuntimeError, match="this track\\(\\) block is open already"):
        block.__enter__()


SCRIPT = """
import torch, torch.distributed as dist, sys
from torch.nn.parallel import DistributedDataParallel as DDP
import syncscope
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
model = DDP(torch.nn.Linear(4, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
stats = syncscope.track().__enter__()  # the block object is not kept, and never exited
for _ in range(2):
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
print(stats.grad_syncs_per_window)
"""


@pytest.mark.slow
def test_a_block_never_exited_records_and_closes_quietly_at_exit(tmp_path: Path) -> None:
    """Was: the block recorded nothing (its object was collected at once) and the
    interpreter's exit printed 'Exception ignored ... TypeError'."""
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "store")],
        env=tree_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "[1, 1]\n"
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr
