"""Predicted vs measured: no wrapper, one blocking all-reduce per parameter after every
micro-batch's backward. ``--sync-last-only`` is the fixed loop: after the last one only.
"""

import sys

import torch
import torch.distributed as dist
from _bench import Clock, finish, init, make_data, make_model, parse_args

last_only = "--sync-last-only" in sys.argv
if last_only:
    sys.argv.remove("--sync-last-only")
args = parse_args()
rank = init(args)
model = make_model(args)
for p in model.parameters():
    dist.broadcast(p.data, 0)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = make_data(args, rank)
clock = Clock(args, rank, "per_param_last_only" if last_only else "per_param_every_microbatch")

for step in range(args.steps):  # noqa: B007 (the shape users write)
    for micro in range(args.accum):
        loss = model(data[micro]).pow(2).mean() / args.accum
        loss.backward()
        if not last_only or micro == args.accum - 1:
            for p in model.parameters():
                dist.all_reduce(p.grad)
    optimizer.step()
    optimizer.zero_grad()
    clock.tick()
clock.report()
finish(args, rank)
