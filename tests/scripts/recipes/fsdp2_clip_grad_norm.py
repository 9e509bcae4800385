"""FSDP2 with ``torch.nn.utils.clip_grad_norm_`` before each step: the gradients are DTensor
shards, so the norm is computed on each shard and all-reduced over the shard group (a DTensor
functional collective: ``_c10d_functional::all_reduce``), once per window.

Public shape: torchtitan's and torchtune's FSDP2 training loops (``clip_grad_norm_`` over the
sharded parameters, then ``optimizer.step()``), with FSDP2's default sharded accumulation
(a reduce-scatter per micro-batch).

    torchrun --nproc-per-node 2 fsdp2_clip_grad_norm.py [--windows 3] [--accum 4]

Expected truth: 4 reduce-scatters per window (one per micro-batch, FSDP's own), and one
all-reduce of the norm after the last backward, which reduces no gradient (counted by
torch.profiler: a DTensor's collective goes through no ``torch.distributed`` function);
parameters equal across ranks.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout: tests.helpers
from tests.helpers.truth import Truth, parse


def main(truth: Truth) -> None:
    from torch.profiler import ProfilerActivity, profile

    args = parse()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(dist.get_rank())
    norm_all_reduces = []
    for _ in range(args.windows):
        for micro in range(args.accum):
            truth.micro(micro)
            loss = model(torch.randn(8, 16, generator=g)).pow(2).mean() / args.accum
            truth.backward(loss)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        names = [e.name for e in prof.events()]
        norm_all_reduces.append(
            sum(
                n in ("_c10d_functional::all_reduce", "_c10d_functional::all_reduce_")
                for n in names
            )
        )
        optimizer.step()
        truth.compare_replicas(dict(model.named_parameters()))
        optimizer.zero_grad()
        truth.end_window()
    truth.notes["norm_all_reduces"] = norm_all_reduces
    dist.destroy_process_group()


if __name__ == "__main__":
    t = Truth("fsdp2_clip_grad_norm")
    t.run(lambda: main(t))
