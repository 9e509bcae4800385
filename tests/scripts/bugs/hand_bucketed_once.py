"""No DDP: one hand all-reduce of the flattened gradients per window, after the last
micro-batch's backward. The correct hand-written sync: gradients reduced once.

Public shape: the hand-bucketed data parallelism of minimal trainers (the gradients
flattened into one buffer, all-reduced, averaged and copied back before
``optimizer.step()``), the contrast to moe_subgroup.py (a correct
hand-bucketed sync, reduced once, stays clean).

    torchrun --nproc-per-node 2 hand_bucketed_once.py [--windows 3] [--accum 4]

Expected truth: 1 round per window, on the last micro-batch (after its backward);
parameters equal across ranks (same seed for the initial parameters).
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout: tests.helpers
from tests.helpers.truth import Truth, parse


def main(truth: Truth) -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(args.windows):
        for micro in range(args.accum):
            truth.micro(micro)
            loss = model(torch.randn(8, 16, generator=g)).pow(2).mean() / args.accum
            with truth.phase("backward"):
                loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in params])  # one bucket
        dist.all_reduce(flat)
        flat.div_(world)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
            offset += p.numel()
        optimizer.step()
        truth.compare_replicas(dict(model.named_parameters()))
        optimizer.zero_grad()
        truth.end_window()
    dist.destroy_process_group()


if __name__ == "__main__":
    t = Truth("hand_bucketed_once")
    t.run(lambda: main(t))
