"""A gloo job that leaves torch Flight Recorder dumps, one per rank, for the FR tests.

``python -m torch.distributed.run --nproc-per-node N flight_job.py SCENARIO OUT``, with
``TORCH_FR_BUFFER_SIZE`` set. Each rank writes ``OUT/fr_<rank>`` (pickle, what
``_dump_fr_trace`` returns) and ``OUT/fr_json_<rank>.json`` (``_dump_fr_trace_json``).

A DDP loop of 2 windows x 2 micro-batches (``no_sync`` on the first), then per window
``dist.all_reduce(loss)`` and ``dist.all_reduce(metric)`` (one element each), then:

- ``healthy``: every rank dumps at the end.
- ``skip``: rank 1 skips window 1's loss all-reduce. Its later calls pair with the other
  ranks' next ones (same sizes, so gloo does not stop); the others are left waiting in the
  last one, time out (gloo's timeout, 4 s) and dump; rank 1 dumps at its end.
- ``hang``: rank 1 never reaches window 1's second micro-batch (stuck outside any
  collective); the others wait in its DDP bucket all-reduce and dump on the timeout; rank 1
  is dumped from a second thread while its main thread is stuck (as torch's watchdog
  dumps every rank of a job that timed out).
- ``size``: after the loop, a broadcast from rank 0 where the last rank's tensor has half
  the elements. gloo aborts the process (SIGABRT) that receives the wrong size, so each rank
  dumps right after issuing its broadcast (``async_op=True``), before the data moves: the
  last rank first, then the others in turn (each waits for the previous rank's dump file),
  rank 0, the sender, last.
- ``dtype``: the last rank all-reduces int32 where the others all-reduce float32 (the same
  bytes: gloo runs it and returns garbage); every rank dumps at the end.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

WAIT_S = 4.0


def dump(out: Path, rank: int) -> None:
    from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

    pickled = _dump_fr_trace(True, True, False)
    as_json = _dump_fr_trace_json(True, False)
    (out / f"fr_json_{rank}.json.tmp").write_bytes(as_json)
    (out / f"fr_json_{rank}.json.tmp").rename(out / f"fr_json_{rank}.json")
    (out / f"fr_{rank}.tmp").write_bytes(pickled)
    (out / f"fr_{rank}.tmp").rename(out / f"fr_{rank}")


def wait_for(path: Path, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def train(model: DDP, scenario: str, rank: int, out: Path) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for window in range(2):
        for micro in range(2):
            if scenario == "hang" and rank == 1 and window == 1 and micro == 1:
                threading.Timer(WAIT_S, dump, (out, rank)).start()
                wait_for(out / "fr_0")  # stuck outside any collective
                return
            ctx = model.no_sync() if micro == 0 else contextlib.nullcontext()
            with ctx:
                model(torch.randn(4, 8)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        loss = torch.ones(1)
        metric = torch.ones(1)
        if not (scenario == "skip" and rank == 1 and window == 1):
            dist.all_reduce(loss)
        dist.all_reduce(metric)


def mismatch(scenario: str, rank: int, world: int, out: Path) -> None:
    last = world - 1
    if scenario == "dtype":
        dist.all_reduce(torch.ones(4, dtype=torch.int32 if rank == last else torch.float32))
        return
    for earlier in range(rank + 1, world) if rank else range(1, world):
        wait_for(out / f"fr_{earlier}")
    tensor = torch.ones(4 if rank == last else 8)
    work = dist.broadcast(tensor, 0, async_op=True)
    dump(out, rank)
    with contextlib.suppress(RuntimeError):
        work.wait()
    time.sleep(0.5)


def main() -> None:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=WAIT_S))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1)))
    try:
        train(model, scenario, rank, out)
        if scenario in ("size", "dtype"):
            mismatch(scenario, rank, world, out)
    except RuntimeError:  # gloo's timeout or a peer gone: what a watchdog dumps on
        pass
    if not (out / f"fr_{rank}").exists() and not (scenario == "hang" and rank == 1):
        dump(out, rank)
    if scenario == "hang" and rank == 1:
        wait_for(out / f"fr_{rank}")
    os._exit(0)  # no destroy_process_group: peers may be gone or stuck


if __name__ == "__main__":
    main()
