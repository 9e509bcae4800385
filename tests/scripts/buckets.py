"""DDP with several gradient buckets per backward, for the compiled-kernel tests.

4 x Linear(64, 64) with 16 KiB buckets (4 bucket all-reduces per synced backward), 3
windows of 3 micro-batches: window 0 syncs every micro-batch, windows 1-2 only the last
(``no_sync`` before), and a user all-reduce of the loss after each step (a collective the
Python kernel records, between DDP's).
"""

import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)]), bucket_cap_mb=1 / 64)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(rank)
for step in range(3):
    for micro in range(3):
        skip = step > 0 and micro < 2
        with model.no_sync() if skip else contextlib.nullcontext():
            loss = model(torch.randn(8, 64, generator=g)).pow(2).mean() / 3
            loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    dist.all_reduce(loss.detach())
dist.destroy_process_group()
