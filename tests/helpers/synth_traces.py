"""Synthetic Kineto traces of a DDP job with gradient accumulation, at any size.

For benchmarks and tests: ``write_job(out_dir, ranks=8, target_bytes=50 << 20)`` writes
``rank-R.json`` (or ``.json.gz``) files shaped like real torch.profiler output: a
``distributedInfo`` header, ``DistributedDataParallel.forward`` annotations, CPU ops,
``autograd::engine::evaluate_function:`` backward ops, DDP bucket ``c10d::allreduce_`` with
nested ``record_param_comms``, GPU kernels with their launches, and nested duplicate
``Optimizer.step#`` annotations. Windows are written until the file reaches its size.

Two layouts: ``torch`` writes each event as torch.profiler's Kineto writer does on a GPU
(indented, its usual args, an ``ac2g`` flow pair per launch: about 220 bytes an event, as
in real GPU traces); ``compact`` writes the same events minimal and unspaced, without the
flow pairs (about 145 bytes an event: the most work a megabyte can describe).

    python -m tests.helpers.synth_traces OUT_DIR --ranks 8 --mb 50 [--layout torch]
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

MAIN, AUTOGRAD, STREAM, COMM_STREAM = 100, 101, 7, 20


@dataclass
class Shape:
    micro_batches: int = 4
    buckets: int = 5
    bucket_nelems: int = 1 << 20
    ops_per_forward: int = 60
    sync_every_micro_batch: bool = False  # True: redundant syncs (no no_sync)
    mismatch_rank: int | None = None  # this rank issues a broadcast instead of a bucket


class _Clock:
    def __init__(self) -> None:
        self.us = 1_000_000.0
        self.ext = 0

    def span(self, dur: float) -> tuple[float, float]:
        start = self.us
        self.us += dur
        return start, dur

    def next_id(self) -> int:
        self.ext += 1
        return self.ext


def _x(name: str, cat: str, ts: float, dur: float, tid: int, **args: Any) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def _kernel(c: _Clock, name: str, ts: float, dur: float, stream: int) -> list[dict[str, Any]]:
    corr = c.next_id()
    launch = _x("cudaLaunchKernel", "cuda_runtime", ts, 3.0, MAIN, correlation=corr)
    kernel = _x(name, "kernel", ts + 5.0, dur, stream, correlation=corr, stream=stream, device=0)
    kernel["pid"] = 0
    return [launch, kernel]


def _forward(c: _Clock, shape: Shape) -> Iterator[dict[str, Any]]:
    start = c.us
    c.us += 2.0
    for i in range(shape.ops_per_forward):
        ts, dur = c.span(20.0)
        yield _x(
            "aten::linear", "cpu_op", ts, dur, MAIN, **{"Input Dims": [[32, 1024], [1024, 1024]]}
        )
        yield from _kernel(c, f"sm80_xmma_gemm_f32f32_{i % 4}", ts, 15.0, STREAM)
    yield _x("DistributedDataParallel.forward", "user_annotation", start, c.us - start, MAIN)


def _backward(c: _Clock, shape: Shape, rank: int, sync: bool) -> Iterator[dict[str, Any]]:
    per_bucket = max(1, shape.ops_per_forward // shape.buckets)
    for b in range(shape.buckets):
        for _ in range(per_bucket):
            ts, dur = c.span(30.0)
            name = "autograd::engine::evaluate_function: AddmmBackward0"
            yield _x(name, "cpu_op", ts, dur, AUTOGRAD)
            yield from _kernel(c, "sm80_xmma_gemm_bwd_f32", ts, 25.0, STREAM)
        if not sync:
            continue
        op = "broadcast" if rank == shape.mismatch_rank and b == 0 else "allreduce"
        ts, dur = c.span(40.0)
        yield _x(f"c10d::{op}_", "cpu_op", ts, dur, AUTOGRAD)
        yield _x(
            "record_param_comms", "cpu_op", ts + 2.0, dur - 4.0, AUTOGRAD,
            **{"Collective name": op, "In msg nelems": shape.bucket_nelems, "Out msg nelems":
               shape.bucket_nelems, "dtype": "Float", "Process Group Name": "0",
               "Process Group Ranks": "[]", "Group size": 0},
        )  # fmt: skip
        yield from _kernel(
            c, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", ts, 300.0, COMM_STREAM
        )


def _window(c: _Clock, shape: Shape, rank: int) -> Iterator[dict[str, Any]]:
    for k in range(shape.micro_batches):
        last = k == shape.micro_batches - 1
        yield from _forward(c, shape)
        yield from _backward(c, shape, rank, last or shape.sync_every_micro_batch)
        c.us += 50.0
    ts, dur = c.span(200.0)
    yield _x("Optimizer.step#SGD.step", "user_annotation", ts, dur, MAIN)
    yield _x("Optimizer.step#SGD.step", "user_annotation", ts + 1.0, dur - 2.0, MAIN)
    ts, dur = c.span(20.0)
    yield _x("Optimizer.zero_grad#SGD.zero_grad", "user_annotation", ts, dur, MAIN)


LAYOUTS = ("torch", "compact")


def _us(value: float) -> str:
    return f"{value:.3f}"


def _torch_event(e: dict[str, Any]) -> bytes:
    """``e`` as Kineto's JSON writer lays it out, with the args it writes for its kind."""
    cat, args = e["cat"], dict(e["args"])
    if cat == "kernel":
        args = {"External id": args["correlation"], "queued": 0, "device": 0, "context": 1,
                "stream": args["stream"], "correlation": args["correlation"],
                "registers per thread": 30, "shared memory": 0, "blocks per SM": 5.3,
                "warps per SM": 21.2, "grid": [4, 106, 1], "block": [128, 1, 1],
                "est. achieved occupancy %": 33}  # fmt: skip
    elif cat == "cuda_runtime":
        args = {"External id": args["correlation"], "cbid": 211, **args}
    elif cat == "cpu_op":
        args = {"External id": 1, "Record function id": 0, "Ev Idx": 0, **args}
    arg_text = ", ".join(
        f'"{k}": {json.dumps(v, separators=(", ", ": "))}' for k, v in args.items()
    )
    text = (
        f'  {{\n    "ph": "X", "cat": "{cat}", "name": {json.dumps(e["name"])}, '
        f'"pid": {e["pid"]}, "tid": {e["tid"]},\n    "ts": {_us(e["ts"])}, "dur": {_us(e["dur"])},\n'
        f'    "args": {{\n      {arg_text}\n    }}\n  }}'
    )
    if cat in ("kernel", "cuda_runtime"):  # the flow arrow from a launch to its kernel
        ph, bp = ("f", ', "bp": "e"') if cat == "kernel" else ("s", "")
        text += (
            f',\n  {{\n    "ph": "{ph}", "id": {args["correlation"]}, "pid": {e["pid"]}, '
            f'"tid": {e["tid"]}, "ts": {_us(e["ts"])},\n    "cat": "ac2g", "name": "ac2g"{bp}\n  }}'
        )
    return text.encode()


def write_rank(
    path: Path,
    rank: int,
    world: int,
    target_bytes: int,
    shape: Shape | None = None,
    layout: str = "compact",
    windows: int | None = None,
) -> int:
    """Write one rank's trace of at least ``target_bytes`` (or of exactly ``windows``
    windows); returns the windows written. ``layout``: ``torch`` or ``compact`` (the module
    docstring)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: one of {', '.join(LAYOUTS)}")
    dump = _torch_event if layout == "torch" else orjson.dumps
    shape = shape or Shape()
    header = {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
    }
    clock = _Clock()
    gz = path.suffix == ".gz"
    written = done = 0
    with gzip.open(path, "wb", compresslevel=1) if gz else path.open("wb") as out:
        # spaced as torch.profiler writes it: HTA finds a file's rank with the regex
        # '"rank":\\s+(\\d+)', and on a compact '"rank":3' takes every file for rank 0
        head = json.dumps(header).encode()[:-1] + b', "traceEvents": [\n'
        out.write(head)
        first = True
        while (done < windows) if windows is not None else (written < target_bytes or not done):
            chunk = b",\n".join(dump(e) for e in _window(clock, shape, rank))
            out.write(chunk if first else b",\n" + chunk)
            first = False
            written += len(chunk) + 2
            done += 1
        out.write(b'\n], "traceName": "synthetic"}\n')
    return done


def write_job(
    out_dir: Path,
    ranks: int,
    target_bytes: int,
    shape: Shape | None = None,
    gz: bool = False,
    layout: str = "compact",
) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"rank-{r}.json{'.gz' if gz else ''}" for r in range(ranks)]
    for r, path in enumerate(paths):
        write_rank(path, r, ranks, target_bytes, shape, layout)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--mb", type=float, default=50.0, help="size of each rank file (MB)")
    parser.add_argument("--gz", action="store_true")
    parser.add_argument("--redundant", action="store_true", help="sync every micro-batch")
    parser.add_argument("--layout", choices=LAYOUTS, default="compact")
    args = parser.parse_args(argv)
    shape = Shape(sync_every_micro_batch=args.redundant)
    write_job(args.out, args.ranks, int(args.mb * (1 << 20)), shape, args.gz, args.layout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
