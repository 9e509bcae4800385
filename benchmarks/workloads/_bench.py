"""Shared by the benchmark workloads: arguments, model, data and the in-script window clock.

Two kinds of workload use it. The scripts in this folder import it directly. The loops
examples/ already has (``EXAMPLE_CONFIGS``) are not copied here: the harness runs the
example itself through ``run_example.py``, which hands examples/common.py's
``parse_args``/``batch``/``report`` to ``ExampleBench`` (benchmark arguments and sizes, data
made before the clock starts, the clock ticked at the end of every optimizer step). The
examples themselves know nothing of benchmarks.

Each workload is a plain torchrun script that runs unchanged under ``torchrun`` and under
``syncscope profile``. It times its own optimizer-step windows with ``time.perf_counter``
(start-up, warm-up windows and teardown excluded), and the CPU time of the rank process
over the same spans (``time.process_time``, all its threads: far less sensitive than wall
time to other jobs sharing the cores), and rank 0 prints one line::

    SYNCSCOPE_BENCH {"config": "no_sync", "window_s": [...], "accum": 4, ...}

``--torch-profiler DIR`` wraps the whole loop in a bare ``torch.profiler`` CPU trace (the
reference point for capture cost); the trace is exported after the timed windows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _gate import GATE_ENV, wait_at_gate  # the workload's own folder is on sys.path
from torch import nn

MARK = "SYNCSCOPE_BENCH"
_profiler: Any = None


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--windows", type=int, default=4, help="timed optimizer steps")
    parser.add_argument("--warmup", type=int, default=1, help="untimed optimizer steps first")
    parser.add_argument("--accum", type=int, default=4, help="micro-batches per step")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--torch-profiler", metavar="DIR", help="trace with torch.profiler")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="cuda: NCCL, one GPU per rank"
    )
    args = parser.parse_args()
    args.steps = args.warmup + args.windows
    return args


def init(args: argparse.Namespace) -> int:
    """Join the process group torchrun prepared (gloo on CPU); returns this rank."""
    global _profiler
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    torch.manual_seed(0)
    if args.torch_profiler:
        _profiler = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
        )
        _profiler.__enter__()
    return dist.get_rank() if dist.is_initialized() else 0


def make_model(args: argparse.Namespace) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.hidden, args.hidden), nn.ReLU()]
    return nn.Sequential(*layers).to(_device(args))


def _device(args: argparse.Namespace) -> torch.device:
    if args.device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def make_data(args: argparse.Namespace, rank: int) -> list[torch.Tensor]:
    """One input per micro-batch, different on every rank, made before the clock starts."""
    g = torch.Generator().manual_seed(1000 + rank)
    device = _device(args)
    return [torch.randn(args.batch, args.hidden, generator=g).to(device) for _ in range(args.accum)]


class Clock:
    """Marks the end of every window; reports the timed ones from rank 0."""

    def __init__(self, args: argparse.Namespace, rank: int, config: str) -> None:
        self.args = args
        self.rank = rank
        self.config = config
        self.marks = [time.perf_counter()]
        self.cpu_marks = [time.process_time()]
        self.thread_marks = [time.thread_time()]  # the training thread alone

    def tick(self) -> None:
        if self.args.device == "cuda":
            torch.cuda.synchronize()  # a window ends when its kernels have
        if len(self.marks) == self.args.warmup and os.environ.get(GATE_ENV):
            wait_at_gate(self.rank)  # the last warm-up window ends: the timed ones start together
        self.marks.append(time.perf_counter())
        self.cpu_marks.append(time.process_time())
        self.thread_marks.append(time.thread_time())

    def report(self) -> None:
        if self.rank != 0:
            return
        spans = [b - a for a, b in zip(self.marks, self.marks[1:], strict=False)]
        cpu = [b - a for a, b in zip(self.cpu_marks, self.cpu_marks[1:], strict=False)]
        thread = [b - a for a, b in zip(self.thread_marks, self.thread_marks[1:], strict=False)]
        record: dict[str, Any] = {
            "config": self.config,
            "window_s": spans[self.args.warmup :],
            "warmup_s": spans[: self.args.warmup],
            "window_cpu_s": cpu[self.args.warmup :],
            "window_thread_cpu_s": thread[self.args.warmup :],
            "accum": self.args.accum,
            "layers": self.args.layers,
            "hidden": self.args.hidden,
            "batch": self.args.batch,
            "world_size": dist.get_world_size() if dist.is_initialized() else 1,
            "torch_profiler": bool(self.args.torch_profiler),
        }
        print(f"{MARK} {json.dumps(record)}", flush=True)


def finish(args: argparse.Namespace, rank: int) -> None:
    if _profiler is not None:
        _profiler.__exit__(None, None, None)
        Path(args.torch_profiler).mkdir(parents=True, exist_ok=True)
        _profiler.export_chrome_trace(str(Path(args.torch_profiler) / f"rank-{rank}.json.gz"))
    if dist.is_initialized():
        dist.destroy_process_group()


# example script -> the configuration name its SYNCSCOPE_BENCH line carries (a copy that
# ``syncscope fix`` rewrote keeps the name of the loop it was made from)
EXAMPLE_CONFIGS = {
    "ddp_sync_every_step": "sync_every_microbatch",
    "ddp_no_sync_backward_only": "no_sync_backward_only",
    "ddp_no_sync": "no_sync",
    "accelerate_accumulate": "accelerate_accumulate",
    "fsdp2_no_toggle": "fsdp2_every_microbatch",
    "fsdp2_toggle": "fsdp2_last_only",
}


class ExampleBench:
    """An example (examples/common.py) run as a benchmark workload (``run_example.py``).

    The example's own loop is what runs; this changes what its helpers do: the arguments
    and sizes are this folder's (``--windows``/``--warmup``/``--torch-profiler``; the
    example's ``--steps`` is their sum), ``batch`` returns ``make_data``'s inputs, made on
    the first call, before the clock (and the ``--torch-profiler`` trace) starts,
    ``report`` ends a window (``Clock.tick``, the gate included) and after the last one
    prints the ``SYNCSCOPE_BENCH`` line and exports the trace. The example's
    ``loss.item()`` per optimizer step stays in the window (one scalar read)."""

    def __init__(self) -> None:
        self.data: list[torch.Tensor] | None = None
        self.clock: Clock | None = None

    def parse_args(self, parser: argparse.ArgumentParser) -> argparse.Namespace:
        parser.add_argument("--windows", type=int, default=4, help="timed optimizer steps")
        parser.add_argument("--warmup", type=int, default=1, help="untimed optimizer steps first")
        parser.add_argument("--torch-profiler", metavar="DIR", help="trace with torch.profiler")
        parser.set_defaults(hidden=1024, layers=8, batch=32)  # this folder's, as parse_args
        args = parser.parse_args()
        args.steps = args.warmup + args.windows
        return args

    def batch(self, args: argparse.Namespace, rank: int, micro: int) -> torch.Tensor:
        if self.data is None:
            global _profiler
            self.data = make_data(args, rank)
            if args.torch_profiler:
                _profiler = torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
                )
                _profiler.__enter__()
            stem = Path(sys.argv[0]).stem
            self.clock = Clock(args, rank, EXAMPLE_CONFIGS.get(stem, stem))
        return self.data[micro]

    def report(self, args: argparse.Namespace, rank: int, step: int) -> None:
        assert self.clock is not None, "report() before the first batch()"
        self.clock.tick()
        if step == args.steps - 1:
            self.clock.report()
            if _profiler is not None:
                _profiler.__exit__(None, None, None)
                Path(args.torch_profiler).mkdir(parents=True, exist_ok=True)
                trace = Path(args.torch_profiler) / f"rank-{rank}.json.gz"
                _profiler.export_chrome_trace(str(trace))
