"""A compiled training loop for the torch.compile tests: DDP or FSDP2, no_sync accumulation.

    torchrun --nproc-per-node 2 compiled.py --wrapper ddp --backend aot_eager --dump DIR

Each rank writes ``DIR/counters-RANK.json``: Dynamo's counters (graph breaks, recompiles,
unique graphs, frames) after the last step, so plain and profiled runs can be compared.
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

parser = argparse.ArgumentParser()
parser.add_argument("--wrapper", choices=("ddp", "fsdp2"), default="ddp")
parser.add_argument("--backend", default="aot_eager")
parser.add_argument("--steps", type=int, default=2)
parser.add_argument("--accum", type=int, default=4)
parser.add_argument("--dump", type=Path, required=True)
args = parser.parse_args()

if "RANK" in os.environ and not dist.is_initialized():
    dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
if args.wrapper == "ddp":
    from torch.nn.parallel import DistributedDataParallel as DDP

    model: nn.Module = DDP(net)

    def accumulate(last: bool) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext() if last else model.no_sync()  # type: ignore[operator]
else:
    from torch.distributed.fsdp import fully_shard

    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    model = fully_shard(net)

    def accumulate(last: bool) -> contextlib.AbstractContextManager[None]:
        model.set_requires_gradient_sync(last)  # type: ignore[operator]
        return contextlib.nullcontext()


compiled = torch.compile(model, backend=args.backend)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(args.steps):
    for micro in range(args.accum):
        g = torch.Generator().manual_seed(100 * step + 10 * micro + rank)
        with accumulate(micro == args.accum - 1):
            loss = compiled(torch.randn(8, 16, generator=g)).pow(2).mean()
            loss.backward()
    optimizer.step()
    optimizer.zero_grad()

from torch._dynamo.utils import counters  # noqa: E402

args.dump.mkdir(parents=True, exist_ok=True)
summary = {
    "graph_break": dict(counters["graph_break"]),
    "graph_breaks": sum(counters["graph_break"].values()),
    "recompiles": sum(counters["recompiles"].values()),
    "unique_graphs": counters["stats"]["unique_graphs"],
    "frames_ok": counters["frames"]["ok"],
    "frames_total": counters["frames"]["total"],
    "loss": float(loss.item()),
}
(args.dump / f"counters-{rank}.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
dist.destroy_process_group()
