"""Predicted vs measured: FSDP2 reduce-scattering gradients on every micro-batch (no toggle).

``--sync-last-only`` is the fixed loop: ``set_requires_gradient_sync(is_last)``.
"""

import sys

import torch
from _bench import Clock, finish, init, make_data, make_model, parse_args
from torch.distributed.fsdp import fully_shard

last_only = "--sync-last-only" in sys.argv
if last_only:
    sys.argv.remove("--sync-last-only")
args = parse_args()
rank = init(args)
model = make_model(args)
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = make_data(args, rank)
clock = Clock(args, rank, "fsdp2_last_only" if last_only else "fsdp2_every_microbatch")

for step in range(args.steps):  # noqa: B007 (the shape users write)
    for micro in range(args.accum):
        if last_only:
            model.set_requires_gradient_sync(micro == args.accum - 1)
        loss = model(data[micro]).pow(2).mean() / args.accum
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    clock.tick()
clock.report()
finish(args, rank)
