"""Shared set-up for the examples: arguments, a small MLP and synthetic data it learns.

Every example is a normal torchrun script: ``torchrun --nproc-per-node 2 ddp_no_sync.py``.
The model size is set so that communication matters when you ask it to (``--hidden 1024
--layers 8``) and stays tiny for tests (the defaults).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn


def arg_parser() -> argparse.ArgumentParser:
    """The examples' options: the loop's shape, the model's size and the device."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps (windows)")
    parser.add_argument("--accum", type=int, default=4, help="micro-batches per step")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="cuda: NCCL, one GPU per rank"
    )
    return parser


def parse_args() -> argparse.Namespace:
    return arg_parser().parse_args()


def init(args: argparse.Namespace | None = None) -> int:
    """Join the process group torchrun prepared (gloo on CPU, NCCL with ``--device cuda``);
    returns this rank."""
    cuda = args is not None and args.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(0)
    return dist.get_rank() if dist.is_initialized() else 0


def make_model(args: argparse.Namespace) -> nn.Module:
    """An MLP fitted to a fixed random teacher, ``tanh(x @ teacher)``: its output is the
    residual, prediction minus target, so the examples' ``model(x).pow(2).mean()`` is the
    mean squared error, and it falls as the model learns. The teacher is a plain tensor
    (neither a parameter nor a buffer: no wrapper syncs or broadcasts it), the same on every
    rank, and the model stays an ``nn.Sequential`` of its layers."""
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.hidden, args.hidden), nn.ReLU()]
    model = nn.Sequential(*layers).to(device(args))
    g = torch.Generator().manual_seed(1)
    teacher = (torch.randn(args.hidden, args.hidden, generator=g) / args.hidden**0.5).to(
        device(args)
    )

    def residual(
        module: nn.Module, inputs: tuple[torch.Tensor], output: torch.Tensor
    ) -> torch.Tensor:
        return output - torch.tanh(inputs[0] @ teacher)

    model.register_forward_hook(residual)
    return model


def device(args: argparse.Namespace) -> torch.device:
    if args.device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def batch(args: argparse.Namespace, rank: int, step: int, micro: int) -> torch.Tensor:
    """Different data on every rank and micro-batch, reproducible: each rank's small data set
    (one batch per micro-batch) is seen again every step, so the loss falls."""
    g = torch.Generator().manual_seed(10 * micro + rank)
    return torch.randn(args.batch, args.hidden, generator=g).to(device(args))


def report(args: argparse.Namespace, rank: int, step: int, loss: float) -> None:
    if rank == 0 and not args.quiet:
        print(f"step {step} loss {loss:.6f}", flush=True)


def finish() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
