"""Functional collectives on gloo CPU ranks, eager and compiled, for the capture tests.

    torchrun --nproc-per-node 2 functional.py --mode eager|compiled|fsdp2-compiled
    torchrun --nproc-per-node 4 functional.py --mode tp

Every mode runs 2 optimizer steps ("windows") of 2 micro-batches and prints what it issued.

- eager: per micro-batch one ``funcol.all_reduce`` of an activation (not a grad sync); at the
  last micro-batch one ``funcol.all_reduce`` of each parameter's ``.grad`` (2 grad syncs);
- compiled: the same activation all-reduce inside a ``torch.compile``'d function (inductor);
- tp: a column/row-parallel MLP on the "tp" dimension of a (2, 2) CPU mesh, data parallel
  over "dp" with per-parameter gradient all-reduces on the dp group at the last micro-batch.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=("eager", "compiled", "tp"), default="eager")
parser.add_argument("--backend", default="inductor")
args = parser.parse_args()

if "RANK" in os.environ and not dist.is_initialized():
    dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
group: object = dist.group.WORLD
if args.mode == "tp":
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    group = mesh["dp"].get_group()


def activation_sum(x: torch.Tensor) -> torch.Tensor:
    return funcol.all_reduce(x, "sum", dist.group.WORLD) * 0.5


mix = (
    torch.compile(activation_sum, backend=args.backend)
    if args.mode == "compiled"
    else activation_sum
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(2):
    for micro in range(2):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(10 * step + micro + rank))
        out = model(x) if args.mode == "tp" else model(mix(x))
        out.pow(2).mean().backward()
    for p in model.parameters():  # data-parallel gradient average, functional style
        grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        grad.copy_(funcol.all_reduce(grad, "avg", group))
    optimizer.step()
    optimizer.zero_grad()
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
