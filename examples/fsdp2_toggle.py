"""FSDP2 accumulation with ``set_requires_gradient_sync(is_last)`` before each micro-batch.

Pattern 13 (torchtune #2402): one reduce-scatter per optimizer step; unsharded gradients
are held between micro-batches (more memory, less communication).
"""

import torch
from common import batch, finish, init, make_model, parse_args, report
from torch.distributed.fsdp import fully_shard

args = parse_args()
rank = init(args)
model = make_model(args)
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

for step in range(args.steps):
    for micro in range(args.accum):
        model.set_requires_gradient_sync(micro == args.accum - 1)
        loss = model(batch(args, rank, step, micro)).pow(2).mean() / args.accum
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    report(args, rank, step, loss.item())
finish()
