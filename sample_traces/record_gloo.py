"""Record the syncscope-made sample traces (2 gloo ranks on CPU, torch.profiler via --trace).

    python sample_traces/record_gloo.py OUT_DIR {ddp-every,ddp-no_sync,fsdp2} [--windows 3]

Each rank runs a small MLP with gradient accumulation (4 micro-batches per window) and
records windows 1..W with syncscope.capture.profiler.ProfilerTrace, so the traces carry
syncscope's own window / micro-batch annotations next to torch's events.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from syncscope.capture.profiler import ProfilerTrace

ACCUM = 4


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(m for _ in range(4) for m in (nn.Linear(256, 256), nn.ReLU())))


def _worker(rank: int, world: int, out: str, mode: str, windows: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    model: nn.Module
    if mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        model = _model()
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=0.3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    trace = ProfilerTrace(Path(out), rank, (1, 1 + windows))
    x = torch.randn(32, 256)
    for w in range(1 + windows):
        trace.window_begin(w)
        for k in range(ACCUM):
            trace.micro_batch_begin(w, k)
            last = k == ACCUM - 1
            ctx = (
                model.no_sync()  # type: ignore[operator]
                if mode == "ddp-no_sync" and not last
                else contextlib.nullcontext()
            )
            with ctx:
                model(x).pow(2).mean().backward()
            trace.micro_batch_end(w, k)
        opt.step()
        opt.zero_grad()
        trace.window_end(w)
    trace.close()
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("mode", choices=["ddp-every", "ddp-no_sync", "fsdp2"])
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--port", type=int, default=29517)
    args = parser.parse_args()
    mp.spawn(
        _worker, args=(args.world, args.out, args.mode, args.windows, args.port), nprocs=args.world
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
