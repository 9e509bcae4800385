"""Where counting-mode capture time goes: each syncscope hook alone, windows interleaved.

A diagnostic, not part of docs/benchmarks.md: run it under torchrun like a workload::

    torchrun --standalone --nproc-per-node 2 benchmarks/internals/capture_breakdown.py [--rounds 12]

Every round runs one window per variant (plain, every hook, then one hook family at a time)
in a rotating order, in one process, so machine noise hits all variants alike. Rank 0
prints the median window time of each variant and its ratio to plain: wall time, CPU time
of the process (every thread: the writer's flusher and gloo's too) and CPU time of the
training thread alone. ``--cprofile`` also
prints the top functions under cProfile for the full capture.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
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
from torch.utils._python_dispatch import TorchDispatchMode

from syncscope.capture.hooks import collectives
from syncscope.capture.hooks import install as instrument
from syncscope.capture.recorder.core import MemorySink, Recorder
from syncscope.capture.writer import EventWriter

Installer = Callable[[Recorder], Callable[[], None]]


def _families(names: list[str]) -> Installer:
    def install(rec: Recorder) -> Callable[[], None]:
        undo: list[Callable[[], None]] = []
        for name in names:
            if name == "collectives":
                undo.append(collectives.attach(rec))
            else:
                getattr(instrument, f"_install_{name}")(rec, undo)

        def uninstall() -> None:
            for restore in reversed(undo):
                restore()

        return uninstall

    return install


class NullMode(TorchDispatchMode):
    """The mechanism alone: a dispatch mode that passes every op straight through."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def _null_mode(rec: Recorder) -> Callable[[], None]:
    mode = NullMode()
    mode.__enter__()
    return lambda: mode.__exit__(None, None, None)


class IdleRecorder(Recorder):
    """Every hook installed, every recorder body a no-op: what the patches cost alone."""

    def on_forward_begin(self, *args: Any, **kwargs: Any) -> None:
        self.fwd_depth += 1

    def on_backward_begin(self) -> bool:
        return True

    def on_backward_end(self, outermost: bool) -> None:
        pass

    def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
        return None

    def on_step_end(self, *args: Any) -> None:
        pass

    def on_toggle(self, *args: Any, **kwargs: Any) -> None:
        pass

    def on_grad_reset(self, *args: Any, **kwargs: Any) -> None:
        pass

    def before_collective(self, *args: Any, **kwargs: Any) -> None:
        pass

    def on_collective(self, *args: Any, **kwargs: Any) -> None:
        pass


def _idle(rec: Recorder) -> Callable[[], None]:
    return instrument.install(IdleRecorder(MemorySink(), rank=rec.rank, world_size=2))


def _idle_families(names: list[str]) -> Installer:
    def install(rec: Recorder) -> Callable[[], None]:
        return _families(names)(IdleRecorder(MemorySink(), rank=rec.rank, world_size=2))

    return install


def _python_kernel(rec: Recorder) -> Callable[[], None]:
    """Every hook, with the Python kernel for every collective even where the compiled
    one is built (``syncscope.capture.native``; its kernel is registered per install)."""
    from syncscope.capture import native

    saved = list(native._loaded)
    native._loaded.clear()
    native._why_not[:] = ["capture_breakdown: the Python kernel"]
    undo = instrument.install(rec)

    def uninstall() -> None:
        undo()
        native._loaded[:] = saved
        native._why_not.clear()

    return uninstall


VARIANTS: dict[str, Installer | None] = {
    "plain": None,
    "all hooks": instrument.install,
    "all hooks (Python kernel)": _python_kernel,
    "wrapping only": _idle,
    "wrapping: c10d kernels": _idle_families(["collectives"]),
    "wrapping: backward": _idle_families(["backward"]),
    "wrapping: optimizer": _idle_families(["optimizer"]),
    "wrapping: DDP": _idle_families(["ddp"]),
    "c10d kernels": _families(["collectives"]),
    "backward patch": _families(["backward"]),
    "optimizer hooks": _families(["optimizer"]),
    "DDP forward/flag": _families(["ddp"]),
    "null dispatch mode": _null_mode,  # what the earlier TorchDispatchMode capture paid
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, help="default 32 (mlp), the workload's (transformer)")
    parser.add_argument("--accum", type=int, default=4)
    parser.add_argument("--sync-every", action="store_true", help="no no_sync: N syncs/window")
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument(
        "--block",
        type=int,
        default=1,
        help="windows per variant per round; with more than 1 the first window after the "
        "hooks are installed is not timed and each round's figure is its block's median "
        "(installing hooks fresh every window makes them look dearer than in a real run)",
    )
    parser.add_argument(
        "--variants",
        help="comma-separated subset of the variants (plain is always run), e.g. 'all hooks'",
    )
    parser.add_argument(
        "--model",
        choices=("mlp", "transformer"),
        default="mlp",
        help="transformer: workloads/small_transformer.py's TinyGPT (small steps)",
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile (aot_eager)")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    if args.model == "transformer":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workloads"))
        import small_transformer as st

        sys.argv[1:] = []
        targs = st.parse_args()  # the workload's own defaults
        targs.accum = args.accum
        targs.batch = args.batch or targs.batch
        ddp = DDP(st.TinyGPT(targs))
        tokens = st.make_data(targs, rank)
        data = [(t[:, :-1], t[:, 1:]) for t in tokens]
    else:
        layers: list[torch.nn.Module] = []
        for _ in range(args.layers):
            layers += [torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU()]
        ddp = DDP(torch.nn.Sequential(*layers))
        data = [(torch.randn(args.batch or 32, args.hidden),) for _ in range(args.accum)]
    model: Any = torch.compile(ddp, backend="aot_eager") if args.compile else ddp
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)

    def loss_of(out: torch.Tensor) -> torch.Tensor:
        return out if out.dim() == 0 else out.pow(2).mean()

    def window() -> tuple[float, float, float]:
        t0, c0, h0 = time.perf_counter(), time.process_time(), time.thread_time()
        for micro in range(args.accum):
            last = micro == args.accum - 1
            ctx = contextlib.nullcontext() if last or args.sync_every else ddp.no_sync()
            with ctx:
                loss = loss_of(model(*data[micro])) / args.accum
                loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return time.perf_counter() - t0, time.process_time() - c0, time.thread_time() - h0

    tmp = Path(tempfile.mkdtemp(prefix="syncscope-breakdown-"))
    recorders = {
        name: Recorder(EventWriter(tmp / f"{i}-rank{rank}.jsonl"), rank=rank, world_size=2)
        for i, name in enumerate(VARIANTS)
    }
    for _ in range(5):  # compilation, if any, happens here
        window()
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    cpu: dict[str, list[float]] = {name: [] for name in VARIANTS}
    thread: dict[str, list[float]] = {name: [] for name in VARIANTS}  # the training thread
    names = list(VARIANTS)
    if args.variants:
        wanted = {v.strip() for v in args.variants.split(",")}
        unknown = wanted - set(VARIANTS)
        if unknown:
            raise SystemExit(f"unknown variants: {', '.join(sorted(unknown))}")
        names = [n for n in names if n == "plain" or n in wanted]
    profiler = cProfile.Profile() if args.cprofile else None
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            installer = VARIANTS[name]
            undo = installer(recorders[name]) if installer else None
            try:
                if profiler is not None and name == "all hooks":
                    profiler.enable()
                if args.block > 1:
                    window()  # the first window after installing: not timed
                    block = [window() for _ in range(args.block)]
                    wall = statistics.median(b[0] for b in block)
                    used = statistics.median(b[1] for b in block)
                    own = statistics.median(b[2] for b in block)
                else:
                    wall, used, own = window()
                times[name].append(wall)
                cpu[name].append(used)
                thread[name].append(own)
                if profiler is not None and name == "all hooks":
                    profiler.disable()
            finally:
                if undo is not None:
                    undo()
    if rank == 0:
        base = statistics.median(times["plain"])
        base_cpu = statistics.median(cpu["plain"])
        for name in names:
            med = statistics.median(times[name])
            med_cpu = statistics.median(cpu[name])
            # paired: each window over the plain window of its round (adjacent in time)
            paired = [t / p for t, p in zip(times[name], times["plain"], strict=True)]
            paired_cpu = [c / p for c, p in zip(cpu[name], cpu["plain"], strict=True)]
            paired_thread = [c / p for c, p in zip(thread[name], thread["plain"], strict=True)]
            d_thread = [c - p for c, p in zip(thread[name], thread["plain"], strict=True)]
            q = statistics.quantiles(paired, n=4) if len(paired) > 1 else [1.0, 1.0, 1.0]
            print(
                f"{name:20s} wall {med * 1e3:7.2f} ms x{med / base:5.3f} "
                f"(min {min(times[name]) * 1e3:6.1f}) paired x{statistics.median(paired):5.3f} "
                f"(IQR {q[0]:.3f}-{q[2]:.3f}) | CPU {med_cpu * 1e3:7.2f} ms "
                f"x{med_cpu / base_cpu:5.3f} paired x{statistics.median(paired_cpu):5.3f} | "
                f"thread CPU paired x{statistics.median(paired_thread):5.3f} "
                f"({statistics.median(d_thread) * 1e6:+.0f} us/window)"
            )
        if profiler is not None:
            pstats.Stats(profiler).sort_stats(os.environ.get("SORT", "tottime")).print_stats(
                os.environ.get("FILTER", ""), 30
            )
    # let go of the works the recorders watch (as `syncscope profile` does at exit): a work
    # held past destroy_process_group keeps gloo's threads to interpreter exit, which aborts
    for rec in recorders.values():
        rec.footer(0, "done")
        rec.sink.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
