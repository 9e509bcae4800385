"""How much of the capture cost is the hooks' entries, and how low a compact recorder could go.

A diagnostic, not part of docs/benchmarks.md's generated sections: run it under torchrun::

    torchrun --standalone --nproc-per-node 2 benchmarks/hook_floor.py [--model mlp] [--rounds 32]

One process per rank alternates four variants in blocks of windows (rotating order, the
first window of a block not timed): no hooks; every hook with the full recorder; every hook
with no-op bodies (``capture_breakdown.IdleRecorder``); every hook appending one small tuple
(what a recorder that defers building its events would do on the training thread). Rank 0
prints the training thread's user and system CPU time per window
(``getrusage(RUSAGE_THREAD)``) and its minor page faults, medians over the timed windows.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "workloads"))

import small_transformer as st
from capture_breakdown import IdleRecorder

from syncscope.capture import instrument
from syncscope.capture.recorder import MemorySink, Recorder
from syncscope.capture.writer import EventWriter

_now = time.perf_counter_ns


class TupleRecorder(IdleRecorder):
    """Every hook appends one small tuple: the training thread's share of a compact recorder."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[tuple[Any, ...]] = []

    def on_forward_begin(self, wrapper: str, label: str, sync: bool, extra: Any = None) -> None:
        self.fwd_depth += 1
        self.log.append((1, _now(), label, sync))

    def on_forward_end(self) -> None:
        self.fwd_depth -= 1

    def on_backward_begin(self) -> bool:
        self.log.append((2, _now()))
        return True

    def on_backward_end(self, outermost: bool) -> None:
        self.log.append((3, _now()))

    def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
        self.log.append((4, _now()))

    def on_step_end(self, *args: Any) -> None:
        self.log.append((5, _now()))

    def on_toggle(self, how: Any, value: bool, label: str) -> None:
        self.log.append((6, _now(), value))

    def on_grad_reset(self, *args: Any, **kwargs: Any) -> None:
        self.log.append((7, _now()))

    def on_collective(self, opname: str, args: Any, pg: Any, work: Any, t0: int, t1: int,
                      tensors: Any = None) -> None:  # fmt: skip
        self.log.append((8, t0, t1, opname))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=("transformer", "mlp"), default="transformer")
    parser.add_argument("--rounds", type=int, default=32)
    parser.add_argument("--block", type=int, default=4)
    opts = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    loss_of: Callable[[torch.Tensor], torch.Tensor]
    if opts.model == "mlp":
        layers: list[torch.nn.Module] = []
        for _ in range(6):
            layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
        ddp = DDP(torch.nn.Sequential(*layers))
        data: list[tuple[torch.Tensor, ...]] = [(torch.randn(32, 1024),) for _ in range(4)]
        loss_of = lambda out: out.pow(2).mean()  # noqa: E731
    else:
        sys.argv[1:] = []
        args = st.parse_args()  # the workload's own defaults
        ddp = DDP(st.TinyGPT(args))
        data = [(t[:, :-1], t[:, 1:]) for t in st.make_data(args, rank)]
        loss_of = lambda out: out  # noqa: E731
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)

    def window() -> tuple[float, float, int]:
        r0 = resource.getrusage(resource.RUSAGE_THREAD)
        for micro in range(4):
            with ddp.no_sync() if micro < 3 else contextlib.nullcontext():
                (loss_of(ddp(*data[micro])) / 4).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        r1 = resource.getrusage(resource.RUSAGE_THREAD)
        return r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime, r1.ru_minflt - r0.ru_minflt

    tmp = Path(tempfile.mkdtemp(prefix="syncscope-hook-floor-"))
    variants = ["plain", "full recorder", "no-op bodies", "one tuple per hook"]
    results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in variants}
    for _ in range(5):
        window()
    for r in range(opts.rounds):
        for name in variants[r % 4 :] + variants[: r % 4]:
            writer = None
            undo = None
            if name == "full recorder":
                writer = EventWriter(tmp / f"{r}-rank{rank}.jsonl")
                undo = instrument.install(Recorder(writer, rank=rank, world_size=world))
            elif name == "no-op bodies":
                undo = instrument.install(IdleRecorder(MemorySink(), rank=rank, world_size=world))
            elif name == "one tuple per hook":
                undo = instrument.install(TupleRecorder(MemorySink(), rank=rank, world_size=world))
            window()  # the first window after installing: not timed
            results[name] += [window() for _ in range(opts.block)]
            if undo is not None:
                undo()
            if writer is not None:
                writer.close()
    if rank == 0:
        base = statistics.median(x[0] for x in results["plain"])
        for name in variants:
            user = statistics.median(x[0] for x in results[name])
            system = statistics.median(x[1] for x in results[name])
            faults = statistics.median(x[2] for x in results[name])
            print(
                f"{name:20s} user {user * 1e3:7.2f} ms (+{(user - base) * 1e3:5.2f} ms, "
                f"x{user / base:.3f}) system {system * 1e3:5.2f} ms, minor faults {faults:.0f}"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
