"""Module-level functions for ``syncscope.testing.spawn`` (the spawn start method pickles
them by name) and the small DDP loops the tests track.

Loops follow tests/scripts/loops.py: N micro-batches per optimizer step ("window").
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

ACCUM = 4
STEPS = 2


def make_ddp() -> DDP:
    torch.manual_seed(0)
    return DDP(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1)))


def train(model: DDP, accum: int = ACCUM, steps: int = STEPS, mode: str = "no_sync") -> None:
    """``mode``: "every" (pattern 1, no no_sync), "no_sync" (pattern 2, correct) or
    "backward_only" (pattern 3: no_sync entered after the forward, still syncs)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    rank = dist.get_rank() if dist.is_initialized() else 0
    for step in range(steps):
        for micro in range(accum):
            last = micro == accum - 1
            ctx = contextlib.nullcontext() if last else model.no_sync()
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step * 10 + micro + rank))
            if mode == "every":
                model(x).pow(2).mean().backward()
            elif mode == "no_sync":
                with ctx:
                    model(x).pow(2).mean().backward()
            elif mode == "backward_only":
                loss = model(x).pow(2).mean()
                with ctx:
                    loss.backward()
            else:
                raise ValueError(mode)
        optimizer.step()
        optimizer.zero_grad()


# -- functions run by spawn -----------------------------------------------------------------


def fail_on_rank_1() -> str:
    """Rank 1 raises; rank 0 waits for it in a barrier it never joins."""
    if dist.get_rank() == 1:
        _rank_one_helper()
    dist.barrier()
    return "unreachable on rank 1"


def _rank_one_helper() -> None:
    raise ValueError("bad batch on rank 1")


def hang_on_rank_1(pid_dir: str) -> None:
    """Rank 1 sleeps forever; rank 0 waits for it in a barrier. Writes each rank's pid."""
    Path(pid_dir, f"rank{dist.get_rank()}.pid").write_text(str(os.getpid()))
    if dist.get_rank() == 1:
        time.sleep(3600)
    dist.barrier()


def track_ddp(mode: str) -> dict[str, Any]:
    """Track a DDP loop on every rank, then assert one sync per window on the last
    micro-batch (raises AssertionError for a wasteful loop)."""
    from syncscope.testing import assert_syncs
    from syncscope.testing.track import track

    model = make_ddp()
    with track() as stats:
        train(model, mode=mode)
    summary = {
        "rank": stats.rank,
        "world_size": stats.world_size,
        "per_window": stats.grad_syncs_per_window,
        "ranks_seen": [r.rank for r in stats.run.ranks],
        "findings": [(f.kind, f.cause) for f in stats.findings],
    }
    assert_syncs(stats, per_window=1, at_micro_batch=-1)
    return summary


def run_example_tracked(script: str, *args: str) -> dict[str, Any]:
    """Run one of examples/ as its own rank would, inside ``track()``; what it measured."""
    import runpy
    import sys

    from syncscope.testing.track import track

    examples = Path(__file__).resolve().parents[2] / "examples"
    sys.path.insert(0, str(examples))
    sys.argv = [script, "--quiet", *args]
    with track() as stats:
        runpy.run_path(str(examples / script), run_name="__main__")
    return {
        "grad_syncs_per_window": stats.grad_syncs_per_window,
        "positions": [w["grad_sync_micro_batches"] for w in stats.windows if w["complete"]],
        "findings": sorted((f.kind, f.cause) for f in stats.findings),
    }
