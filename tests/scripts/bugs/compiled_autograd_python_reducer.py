"""Compiled autograd with DDP's Python reducer (``optimize_ddp = "python_reducer"``), the
DDP wrapper itself not compiled (the inner module is).

Public shape: pytorch/pytorch issue #109774 (compiled autograd with DDP: gradients reduced
by the Python reducer inside the compiled backward; the report was of reductions dropped
when the DDP wrapper is left uncompiled). On torch 2.13 nothing is dropped: one functional
all-reduce per gradient inside the compiled backward graph on the last micro-batch.

    torchrun --nproc-per-node 2 compiled_autograd_python_reducer.py [--windows 3] [--accum 4]

CPU: ``aot_eager`` for the forward and for the compiled backward. The functional all-reduces
run inside a compiled graph, below Python: the truth counts them with torch.profiler
(``_c10d_functional::all_reduce`` events of each backward, ``Truth.profiled_backward``); a
DDP comm hook would be traced into the graph, so none is registered.

Expected truth: 1 round per window (micro-batch 3), 4 all-reduces (one per parameter);
parameters equal across ranks.
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
    torch._dynamo.config.compiled_autograd = True
    torch._dynamo.config.optimize_ddp = "python_reducer"  # torch refuses the C++ reducer
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    model = DDP(net)  # the wrapper is not compiled
    model.module = torch.compile(net, backend="aot_eager")
    backward_compiler = torch.compile(backend="aot_eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(args.windows):
        for micro in range(args.accum):
            truth.micro(micro)
            is_last = micro == args.accum - 1
            with contextlib.nullcontext() if is_last else model.no_sync():
                loss = model(torch.randn(8, 16, generator=g)).pow(2).mean() / args.accum
                with torch._dynamo.compiled_autograd._enable(backward_compiler):
                    truth.profiled_backward(loss)
        optimizer.step()
        truth.compare_replicas(dict(net.named_parameters()))
        optimizer.zero_grad()
        truth.end_window()
    truth.notes["compiled_autograd_captures"] = torch._dynamo.utils.counters["compiled_autograd"][
        "captures"
    ]
    dist.destroy_process_group()


if __name__ == "__main__":
    t = Truth("compiled_autograd_python_reducer")
    t.run(lambda: main(t))
