"""Post-local SGD, torch's own recipe: ``PostLocalSGDState`` + ``post_localSGD_hook`` on a DDP
model and ``PostLocalSGDOptimizer`` with a ``PeriodicModelAverager``, 4 ranks in subgroups of
2 (``dist.new_subgroups(2)``).

Public shape: the example of torch's ``torch.distributed.algorithms.model_averaging`` docs and
of ``PostLocalSGDOptimizer``'s docstring. For ``start_localSGD_iter`` steps DDP all-reduces
over the world; from then on the hook all-reduces inside each subgroup only, and the
optimizer averages the parameters over the world every ``period`` steps (from
``warmup_steps``): between averagings, replicas agree inside a subgroup and differ across.

    torchrun --nproc-per-node 4 post_local_sgd.py [--windows 6] [--accum 2] [--break-group]

``--break-group``: rank 1 adds noise to its gradients before each step (a real divergence
inside a subgroup, on top of what local SGD does by design).

Expected truth: per window, one round of gradient reductions (the hook's buckets, last
micro-batch); parameters equal inside each subgroup after every step (unless
``--break-group``), across subgroups only right after an averaging.
"""

import argparse
import contextlib
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.algorithms.model_averaging.averagers as averagers
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
    PostLocalSGDState,
    post_localSGD_hook,
)
from torch.distributed.optim import PostLocalSGDOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout: tests.helpers
from tests.helpers.truth import Truth

WARMUP = 2
PERIOD = 2


def main(truth: Truth) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--windows", type=int, default=6)
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--break-group", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    subgroup, _ = dist.new_subgroups(group_size=2)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    model = DDP(net)
    state = PostLocalSGDState(process_group=None, subgroup=subgroup, start_localSGD_iter=WARMUP)
    model.register_comm_hook(state, post_localSGD_hook)
    local = torch.optim.SGD(model.parameters(), lr=0.1)
    averager = averagers.PeriodicModelAverager(period=PERIOD, warmup_steps=WARMUP)
    optimizer = PostLocalSGDOptimizer(optim=local, averager=averager)
    g = torch.Generator().manual_seed(rank)
    truth.notes["subgroup"] = dist.get_process_group_ranks(subgroup)
    for _ in range(args.windows):
        for micro in range(args.accum):
            truth.micro(micro)
            last = micro == args.accum - 1
            with contextlib.nullcontext() if last else model.no_sync():
                loss = model(torch.randn(8, 16, generator=g)).pow(2).mean() / args.accum
                truth.backward(loss)
        if args.break_group and rank == 1:
            for p in model.parameters():
                p.grad.add_(torch.randn(p.grad.shape, generator=g) * 0.01)
        optimizer.step()
        params = dict(net.named_parameters())
        truth.compare_replicas(params, group=subgroup)  # inside the subgroup
        truth.replicas[-1]["world_equal"] = _world_equal(truth, params)
        optimizer.zero_grad()
        truth.end_window()
    truth.notes["world_equal"] = [r["world_equal"] for r in truth.replicas]
    dist.destroy_process_group()


def _world_equal(truth: Truth, params: dict) -> bool:
    with truth.excluded():
        mine = torch.cat([p.detach().reshape(-1) for p in params.values()])
        gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, mine)
    return all(torch.equal(g, gathered[0]) for g in gathered)


if __name__ == "__main__":
    t = Truth("post_local_sgd")
    t.run(lambda: main(t))
