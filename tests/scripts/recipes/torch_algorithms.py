"""torch's own data-parallel algorithms that syncscope reads right, each one loop with correct
``no_sync`` accumulation (``--algo``):

- ``powersgd``: ``PowerSGDState(start_powerSGD_iter=2)`` + ``powerSGD_hook``: plain bucket
  all-reduces for the first steps, then P and Q all-reduces per bucket (some from gloo's
  callback threads): one reduction of the gradients per window;
- ``fp16``: ``fp16_compress_hook``: one all-reduce of a half-precision copy per bucket;
- ``zero``: ``ZeroRedundancyOptimizer`` over SGD: DDP's bucket all-reduce, then a broadcast
  per parameter after ``step()`` (the updated shards), which reduce no gradient;
- ``join``: ``Join([model])`` with uneven inputs (rank 0 has one window fewer): the joined
  rank shadows the other's all-reduces, which are no redundant syncs;
- ``loss``: a ``dist.all_reduce`` of the loss for logging after each window's backward.

    torchrun --nproc-per-node 2 torch_algorithms.py --algo NAME [--windows 3] [--accum 4]

Expected truth: one round of gradient reductions per window (inside the last micro-batch's
backward), parameters equal across ranks after each step (``join``: on the windows both ranks
ran).
"""

import argparse
import contextlib
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout: tests.helpers
from tests.helpers.truth import Truth


def _model(algo: str, truth: Truth) -> DDP:
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
    if algo == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

        state = powersgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2
        )
        model.register_comm_hook(state, powersgd.powerSGD_hook)
    elif algo == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    else:
        truth.ddp_comm_hook(model)
    return model


def main(truth: Truth) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--algo", required=True)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--accum", type=int, default=4)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = _model(args.algo, truth)
    if args.algo == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer = ZeroRedundancyOptimizer(
            model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1
        )
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    windows = args.windows - 1 if args.algo == "join" and rank == 0 else args.windows
    g = torch.Generator().manual_seed(rank)
    joining = contextlib.nullcontext()
    if args.algo == "join":
        from torch.distributed.algorithms.join import Join

        joining = Join([model])
    with joining:
        for _ in range(windows):
            for micro in range(args.accum):
                truth.micro(micro)
                last = micro == args.accum - 1
                with contextlib.nullcontext() if last else model.no_sync():
                    loss = model(torch.randn(8, 16, generator=g)).pow(2).mean() / args.accum
                    truth.backward(loss)
            if args.algo == "loss":
                logged = loss.detach().clone()
                dist.all_reduce(logged)  # for logging: no gradient in it
            optimizer.step()
            if args.algo != "join":
                truth.compare_replicas(dict(model.module.named_parameters()))
            optimizer.zero_grad()
            truth.end_window()
    dist.destroy_process_group()


if __name__ == "__main__":
    t = Truth("torch_algorithms")
    t.run(lambda: main(t))
