"""DDP gradient accumulation with no sync suppression: all-reduces on every micro-batch.

Pattern 1 (torchtune #1275, transformers before PR #7742): correct results, N-1 wasted
gradient all-reduces per optimizer step. ``syncscope fix`` rewrites it to use ``no_sync``.
"""

import torch
from common import batch, finish, init, make_model, parse_args, report
from torch.nn.parallel import DistributedDataParallel as DDP

args = parse_args()
rank = init(args)
model = DDP(make_model(args))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

for step in range(args.steps):
    for micro in range(args.accum):
        loss = model(batch(args, rank, step, micro)).pow(2).mean() / args.accum
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    report(args, rank, step, loss.item())
finish()
