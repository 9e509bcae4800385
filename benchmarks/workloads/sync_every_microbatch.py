"""Accelerate table, row 1: no sync suppression, a gradient all-reduce on every micro-batch.

The baseline (pattern 1). ``syncscope fix`` rewrites this file into the no_sync form.
"""

import torch
from _bench import Clock, finish, init, make_data, make_model, parse_args
from torch.nn.parallel import DistributedDataParallel as DDP

args = parse_args()
rank = init(args)
model = DDP(make_model(args))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = make_data(args, rank)
clock = Clock(args, rank, "sync_every_microbatch")

for step in range(args.steps):  # noqa: B007 (the shape users write)
    for micro in range(args.accum):
        loss = model(data[micro]).pow(2).mean() / args.accum
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    clock.tick()
clock.report()
finish(args, rank)
