"""DDP gradient accumulation done right: ``no_sync()`` around forward and backward.

Pattern 2 (timm, fairseq, Megatron, HF Trainer): one gradient all-reduce per optimizer
step, on the last micro-batch.
"""

import contextlib

import torch
from common import batch, finish, init, make_model, parse_args, report
from torch.nn.parallel import DistributedDataParallel as DDP

args = parse_args()
rank = init(args)
model = DDP(make_model(args))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

for step in range(args.steps):
    for micro in range(args.accum):
        is_last = micro == args.accum - 1
        with model.no_sync() if not is_last else contextlib.nullcontext():
            loss = model(batch(args, rank, step, micro)).pow(2).mean() / args.accum
            loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    report(args, rank, step, loss.item())
finish()
