"""torch.profiler's documented recipe: ``schedule(wait=1, warmup=1, active=2, repeat=2)`` with
``tensorboard_trace_handler(DIR)``, on a DDP loop with correct ``no_sync`` accumulation: each
rank writes one trace file per cycle (``HOST_PID.TIMESTAMP.pt.trace.json``), two per rank, of
one job: the same processes, traced in cycles.

    torchrun --nproc-per-node 2 profiler_cycles.py DIR [--accum 4] [--pause S]

``--pause S``: sleep S seconds in the first step of the second cycle (a "wait" step, not
traced): the two cycles' files are then apart in time by more than S seconds, as a job whose
evaluation or checkpoint runs between cycles.

Expected: 2 cycles of 2 traced optimizer steps per rank, each step reducing once (on the last
micro-batch); ``prof.step()`` after each optimizer step.
"""

import argparse
import contextlib
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--accum", type=int, default=4)
    parser.add_argument("--pause", type=float, default=0.0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(dist.get_rank())
    cycle = schedule(wait=1, warmup=1, active=2, repeat=2)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=cycle,
        on_trace_ready=tensorboard_trace_handler(args.out),
    ) as prof:
        for step in range(9):  # 2 cycles of wait + warmup + active = 8 steps, and one more
            if step == 4 and args.pause:
                time.sleep(args.pause)
            for micro in range(args.accum):
                last = micro == args.accum - 1
                with contextlib.nullcontext() if last else model.no_sync():
                    loss = model(torch.randn(8, 16, generator=g)).pow(2).mean() / args.accum
                    loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
