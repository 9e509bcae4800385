"""DDP with ``no_sync()`` around the backward only: it still all-reduces every micro-batch.

Pattern 3 (speechbrain PR #1449, ClassyVision PR #706). DDP decides at *forward* time
whether the next backward reduces, so a ``no_sync`` entered after the forward is too late.
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
        if micro < args.accum - 1:
            with model.no_sync():
                loss.backward()
        else:
            loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    report(args, rank, step, loss.item())
finish()
