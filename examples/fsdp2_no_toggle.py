"""FSDP2 (``fully_shard``) accumulating without ``set_requires_gradient_sync``.

Pattern 12 (torchtitan, torchtune): a reduce-scatter on every micro-batch. Often deliberate:
it keeps gradients sharded. syncscope reports it as a trade-off with both sides measured.
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
        loss = model(batch(args, rank, step, micro)).pow(2).mean() / args.accum
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    report(args, rank, step, loss.item())
finish()
