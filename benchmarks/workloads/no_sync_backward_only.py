"""Accelerate table, row 2: ``no_sync()`` improperly, around the backward only.

Pattern 3. DDP decides at forward time, so this still all-reduces on every micro-batch.
"""

import torch
from _bench import Clock, finish, init, make_data, make_model, parse_args
from torch.nn.parallel import DistributedDataParallel as DDP

args = parse_args()
rank = init(args)
model = DDP(make_model(args))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = make_data(args, rank)
clock = Clock(args, rank, "no_sync_backward_only")

for step in range(args.steps):  # noqa: B007 (the shape users write)
    for micro in range(args.accum):
        loss = model(data[micro]).pow(2).mean() / args.accum
        if micro < args.accum - 1:
            with model.no_sync():
                loss.backward()
        else:
            loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    clock.tick()
clock.report()
finish(args, rank)
