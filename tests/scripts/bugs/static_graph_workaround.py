"""``DDP(static_graph=True)`` with accumulation, the workaround that runs: micro-batch 0 of
every window synced (its forward outside ``no_sync()``), micro-batches 1 to N-2 under
``no_sync()``, the last synced.

Public shape: baidu-baige/LoongForge issue #163 (the workaround for the static-graph
``no_sync()`` crash of huggingface/accelerate #3679, see static_graph_no_sync.py). The
first synced micro-batch lets DDP record its static graph; the cost is one extra reduction
per window, which must NOT be "fixed" by putting micro-batch 0 under ``no_sync()``: that is
exactly the loop that crashes.

    torchrun --nproc-per-node 2 static_graph_workaround.py [--windows 3] [--accum 4]

Expected truth: 2 rounds per window (micro-batches 0 and 3), replicas equal.
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


def main(truth: Truth) -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)), static_graph=True)
    truth.ddp_comm_hook(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(args.windows):
        for micro in range(args.accum):
            truth.micro(micro)
            synced = micro in (0, args.accum - 1)  # the workaround: micro-batch 0 synced
            with contextlib.nullcontext() if synced else model.no_sync():
                loss = model(torch.randn(8, 16, generator=g)).pow(2).mean() / args.accum
                with truth.phase("backward"):
                    loss.backward()
        optimizer.step()
        truth.compare_replicas(dict(model.module.named_parameters()))
        optimizer.zero_grad()
        truth.end_window()
    dist.destroy_process_group()


if __name__ == "__main__":
    t = Truth("static_graph_workaround")
    t.run(lambda: main(t))
