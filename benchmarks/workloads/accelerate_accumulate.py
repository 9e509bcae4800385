"""Accelerate table, row 4: ``accelerator.accumulate(model)``, step called every iteration.

Pattern 11: Accelerate enters ``no_sync`` on all but the last micro-batch of a window, and
its wrapped optimizer only steps when gradients were synced.
"""

import torch
from _bench import Clock, finish, init, make_data, make_model, parse_args
from accelerate import Accelerator

args = parse_args()
accelerator = Accelerator(gradient_accumulation_steps=args.accum, cpu=True)
rank = init(args)
model = make_model(args)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer = accelerator.prepare(model, optimizer)
data = make_data(args, rank)
clock = Clock(args, rank, "accelerate_accumulate")

for step in range(args.steps):  # noqa: B007 (the shape users write)
    for micro in range(args.accum):
        with accelerator.accumulate(model):
            loss = model(data[micro]).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    clock.tick()
clock.report()
finish(args, rank)
