"""Accelerate table, row 3: ``no_sync()`` around forward and backward of the first N-1.

Pattern 2: one gradient all-reduce per optimizer step, on the last micro-batch.
"""

import contextlib

import torch
from _bench import Clock, finish, init, make_data, make_model, parse_args
from torch.nn.parallel import DistributedDataParallel as DDP

args = parse_args()
rank = init(args)
model = DDP(make_model(args))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = make_data(args, rank)
clock = Clock(args, rank, "no_sync")

for step in range(args.steps):  # noqa: B007 (the shape users write)
    for micro in range(args.accum):
        is_last = micro == args.accum - 1
        with model.no_sync() if not is_last else contextlib.nullcontext():
            loss = model(data[micro]).pow(2).mean() / args.accum
            loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    clock.tick()
clock.report()
finish(args, rank)
