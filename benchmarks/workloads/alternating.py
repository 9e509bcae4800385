"""Predicted vs measured in one process: the buggy and the fixed loop on alternate windows.

``--loop`` picks the pair: ``ddp-every`` (no suppression / ``no_sync`` around forward and
backward), ``ddp-bwd-only`` (``no_sync`` around the backward only / correct), ``fsdp2``
(reduce-scatter every micro-batch / ``set_requires_gradient_sync(is_last)``), ``per-param``
(a blocking all-reduce per parameter after every backward / after the last only). Even
optimizer steps run the buggy loop, odd ones the fixed loop, so both see the same machine
load within a second of each other (bench_prediction.py, "same process").
"""

import contextlib
import sys

import torch
import torch.distributed as dist
from _bench import Clock, finish, init, make_data, make_model, parse_args
from torch.nn.parallel import DistributedDataParallel as DDP

loop = sys.argv[sys.argv.index("--loop") + 1]
del sys.argv[sys.argv.index("--loop") : sys.argv.index("--loop") + 2]
args = parse_args()
rank = init(args)
model = make_model(args)
if loop.startswith("ddp"):
    model = DDP(model)
elif loop == "fsdp2":
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
else:
    for p in model.parameters():
        dist.broadcast(p.data, 0)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = make_data(args, rank)
clock = Clock(args, rank, f"alternating-{loop}")

for step in range(args.steps):
    fixed = step % 2 == 1
    for micro in range(args.accum):
        last = micro == args.accum - 1
        if loop == "fsdp2" and fixed:
            model.set_requires_gradient_sync(last)
        fixed_ddp = loop.startswith("ddp") and fixed and not last
        with model.no_sync() if fixed_ddp else contextlib.nullcontext():  # forward and backward
            loss = model(data[micro]).pow(2).mean() / args.accum
            if loop == "ddp-bwd-only" and not fixed and not last:
                with model.no_sync():  # too late: DDP decided at the forward
                    loss.backward()
            else:
                loss.backward()
        if loop == "per-param" and (last or not fixed):
            for p in model.parameters():
                dist.all_reduce(p.grad)
    optimizer.step()
    optimizer.zero_grad()
    clock.tick()
clock.report()
finish(args, rank)
