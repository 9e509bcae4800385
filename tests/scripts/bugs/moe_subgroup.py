"""DDP over all parameters plus a hand all-reduce (average) of the experts' gradients over
expert-data-parallel subgroups: the experts' gradients are reduced twice per window.

Public shape: the MoE expert-parallel pattern (experts' gradients averaged by hand over an
expert-data-parallel group made with ``dist.new_group``, after ``backward()`` and before
``optimizer.step()``), here with the experts left inside DDP as well, so DDP's bucket
all-reduce has already averaged them over the world.

    torchrun --nproc-per-node 2 moe_subgroup.py [--windows 3] [--accum 4]

Expert-data-parallel groups: consecutive pairs of ranks, made on every rank with
``dist.new_group``: [0, 1] on 2 ranks (the world), [0, 1] and [2, 3] on 4; the hand
all-reduce is ``ReduceOp.AVG`` (gloo has it from torch 2.8; on 2.6 and 2.7 the same mean
as a sum, then divided by the group's size). Accumulation is correct for
DDP (forward and backward under ``no_sync()`` on micro-batches 0-2).

Expected truth: 2 rounds per window, both on micro-batch 3 (DDP's buckets in the backward,
the hand all-reduce of each expert gradient after it); parameters equal across ranks.
"""

import contextlib
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout: tests.helpers
from tests.helpers.truth import Truth, parse


class MoE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(16, 16)
        self.experts = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.shared(x))
        h = sum(torch.relu(expert(h)) for expert in self.experts)
        return self.head(h)


def main(truth: Truth) -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ep_dp_group = None
    for start in range(0, world, 2):  # every rank creates every group, in the same order
        ranks = list(range(start, min(start + 2, world)))
        group = dist.new_group(ranks)
        if rank in ranks:
            ep_dp_group = group
    ep_dp_size = dist.get_world_size(ep_dp_group)
    gloo_averages = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 8)
    average = dist.ReduceOp.AVG if gloo_averages else dist.ReduceOp.SUM
    torch.manual_seed(0)
    net = MoE()
    model = DDP(net)
    truth.ddp_comm_hook(model)
    expert_params = list(net.experts.parameters())
    truth.notes["expert_grad_bytes"] = sum(p.numel() * p.element_size() for p in expert_params)
    truth.notes["ep_dp_group_size"] = ep_dp_size
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(args.windows):
        for micro in range(args.accum):
            truth.micro(micro)
            is_last = micro == args.accum - 1
            with contextlib.nullcontext() if is_last else model.no_sync():
                loss = model(torch.randn(8, 16, generator=g)).pow(2).mean() / args.accum
                with truth.phase("backward"):
                    loss.backward()
        for p in expert_params:  # the experts' gradients averaged by hand, again
            dist.all_reduce(p.grad, op=average, group=ep_dp_group)
            if not gloo_averages:
                p.grad /= ep_dp_size
        optimizer.step()
        truth.compare_replicas(dict(net.named_parameters()))
        optimizer.zero_grad()
        truth.end_window()
    dist.destroy_process_group()


if __name__ == "__main__":
    t = Truth("moe_subgroup")
    t.run(lambda: main(t))
