"""Loss-bearing forward through ``ddp_model.module(x)`` instead of the DDP wrapper.

Public shape: jingyaogong/minimind issue #853 (fixed in #854: the training loop called the
unwrapped ``model.module`` for its loss) and moojink/openvla-oft issue #160 (the forward went
through ``vla.module``). DDP arms its reducer in ``DDP.forward``; a forward that bypasses it
leaves every backward unreduced: no gradient collective at all, and the replicas drift apart
from the first optimizer step.

    torchrun --nproc-per-node 2 module_forward.py [--windows 3] [--accum 4]

Truth (tests/helpers/truth.py): DDP buckets through a pass-through comm hook; expected
0 reductions per window, parameters differ across ranks after every step.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout: tests.helpers
from tests.helpers.truth import Truth, parse


def main(truth: Truth) -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)))
    truth.ddp_comm_hook(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(args.windows):
        for micro in range(args.accum):
            truth.micro(micro)
            x = torch.randn(8, 16, generator=g)
            loss = model.module(x).pow(2).mean() / args.accum  # the bug: DDP bypassed
            with truth.phase("backward"):
                loss.backward()
        optimizer.step()
        truth.compare_replicas(dict(model.module.named_parameters()))
        optimizer.zero_grad()
        truth.end_window()
    dist.destroy_process_group()


if __name__ == "__main__":
    t = Truth("module_forward")
    t.run(lambda: main(t))
