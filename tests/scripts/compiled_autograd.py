"""DDP under torch.compile with compiled autograd (CPU, gloo): DDP's Python reducer issues
one functional all-reduce per gradient in the compiled backward graph.

    torchrun --nproc-per-node 2 compiled_autograd.py

2 optimizer steps of 4 micro-batches, ``no_sync`` on the first 3 (one sync per window).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch._dynamo.config.compiled_autograd = True
# compiled autograd refuses DDP's C++ reducer
torch._dynamo.config.optimize_ddp = "python_reducer"
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)))
compiled = torch.compile(model, backend="aot_eager")
backward_compiler = torch.compile(backend="aot_eager")
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(2):
    for micro in range(4):
        g = torch.Generator().manual_seed(100 * step + 10 * micro + rank)
        with contextlib.nullcontext() if micro == 3 else model.no_sync():
            loss = compiled(torch.randn(8, 16, generator=g)).pow(2).mean()
            with torch._dynamo.compiled_autograd._enable(backward_compiler):
                loss.backward()
    optimizer.step()
    optimizer.zero_grad()
captures = torch._dynamo.utils.counters["compiled_autograd"]["captures"]
print(f"rank {rank} compiled autograd captures {captures}", flush=True)
dist.destroy_process_group()
