"""``torch.distributed.pipelining`` over ``fully_shard`` stages, two ``schedule.step()``
calls per optimizer step.

Public shape: pytorch/torchtitan issue #1732 (gradient accumulation by calling the pipeline
schedule's ``step()`` several times before one ``optimizer.step()``) and pytorch/pytorch
#196641. 4 ranks as pp 2 x dp 2 (a ``("pp", "dp")`` DeviceMesh on cpu): each pipeline stage
is ``fully_shard``'ed over its dp pair. Each ``step()`` runs the schedule's micro-batches
with FSDP's gradient sync off and then, after the last backward and outside autograd,
reduce-scatters the stage's gradients itself (``PipelineStage.perform_reduce_grad``) and
rescales them (``scale_grads``): 2 reductions per optimizer step where 1 is needed.

    torchrun --nproc-per-node 4 pipelining_two_steps.py [--windows 3] [--accum 2]
        [--schedule gpipe|1f1b] [--n-microbatches 2]

``--accum`` is the number of ``step()`` calls per optimizer step (default 2 here). The
truth places each ``step()`` call as one micro-batch (index = the call), phase ``step``.
Expected truth: 2 rounds per window (one reduce-scatter round per ``step()``), parameters
(full tensors) equal across each stage's dp pair.
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout: tests.helpers
from tests.helpers.truth import Truth

DIM = 16


def main(truth: Truth) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--schedule", choices=("gpipe", "1f1b"), default="gpipe")
    parser.add_argument("--n-microbatches", type=int, default=2)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    pp_rank, dp_rank = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    torch.manual_seed(0)
    stages = [
        nn.Sequential(nn.Linear(DIM, DIM), nn.ReLU(), nn.Linear(DIM, DIM), nn.ReLU())
        for _ in range(2)
    ]
    submod = stages[pp_rank]
    for layer in submod:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh["dp"])
    fully_shard(submod, mesh=mesh["dp"])
    stage = PipelineStage(submod, pp_rank, 2, torch.device("cpu"), group=mesh["pp"].get_group())

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (output - target).pow(2).mean()

    schedule_class = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
    schedule = schedule_class(stage, n_microbatches=args.n_microbatches, loss_fn=loss_fn)
    optimizer = torch.optim.SGD(submod.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(dp_rank)  # the same data on both stages of a dp rank
    for _ in range(args.windows):
        for micro in range(args.accum):  # the torchtitan #1732 shape: step() per micro-batch
            truth.micro(micro)
            x = torch.randn(4 * args.n_microbatches, DIM, generator=g)
            y = torch.randn(4 * args.n_microbatches, DIM, generator=g)
            with truth.phase("step"):
                if pp_rank == 0:
                    schedule.step(x)
                else:
                    schedule.step(target=y, losses=[])
        optimizer.step()
        truth.compare_replicas(dict(submod.named_parameters()), group=mesh["dp"].get_group())
        optimizer.zero_grad()
        truth.end_window()
    dist.destroy_process_group()


if __name__ == "__main__":
    t = Truth("pipelining_two_steps")
    t.run(lambda: main(t))
