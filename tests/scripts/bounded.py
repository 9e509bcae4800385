"""A 6-step DDP loop (2 micro-batches, no_sync) that records, at every step, whether
syncscope's hooks are installed; for the bounded-capture tests.

    torchrun --nproc-per-node 2 bounded.py --dump DIR [--steps 6]

Each rank writes ``DIR/steps-RANK.json`` at its last step: per step, whether
``torch.Tensor.backward`` and ``DistributedDataParallel.forward`` are torch's own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--dump", type=Path, required=True)
args = parser.parse_args()

if "RANK" in os.environ and not dist.is_initialized():
    dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


def hooked() -> bool:
    """True while syncscope's wrappers replace torch's own functions."""
    backward_file = torch.Tensor.backward.__code__.co_filename
    forward_file = DDP.forward.__code__.co_filename
    return not (backward_file.endswith("_tensor.py") and forward_file.endswith("distributed.py"))


steps = []
for step in range(args.steps):
    for micro in range(2):
        ctx = contextlib.nullcontext() if micro == 1 else model.no_sync()
        with ctx:
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(10 * step + micro + rank))
            model(x).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    steps.append({"step": step, "hooked_after_zero_grad": hooked()})
    if step == args.steps - 1:
        args.dump.mkdir(parents=True, exist_ok=True)
        (args.dump / f"steps-{rank}.json").write_text(json.dumps(steps))
        print(f"rank {rank} reached its last step {step}", flush=True)
dist.destroy_process_group()
