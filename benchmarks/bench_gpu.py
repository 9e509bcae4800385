"""Capture cost on a GPU (issue 16): plain torchrun against ``syncscope profile``, NCCL.

    python benchmarks/bench_gpu.py [--reps 6] [--nproc 1] [--hidden 4096 --layers 8 ...]

The workload is benchmarks/workloads/no_sync.py with ``--device cuda`` (a window ends with
``torch.cuda.synchronize()``), one rank per GPU. Launches alternate (plain, profile,
profile, plain, ...) so drift hits both alike; the figure is the median of the paired
per-repetition ratios of median window time, with CPU time of rank 0 beside it. Prints the
device, the versions and the table; writes nothing. Without CUDA it says so and exits 2.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from _harness import WORKLOADS, Launch, LaunchFailed

LIMIT = 1.03


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--nproc", type=int, default=1, help="ranks (one GPU each)")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--windows", type=int, default=20)
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("bench_gpu: error: needs a CUDA GPU (none is visible here)", file=sys.stderr)
        return 2
    workload = [
        "--device", "cuda", "--hidden", str(args.hidden), "--layers", str(args.layers),
        "--batch", str(args.batch), "--accum", "4", "--windows", str(args.windows),
        "--warmup", "3",
    ]  # fmt: skip
    launches = [Launch("torchrun", nproc=args.nproc), Launch("profile", nproc=args.nproc)]
    print(f"device: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}")
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {torch.cuda.nccl.version()}")
    print(f"workload: no_sync.py {' '.join(workload)}; {args.nproc} rank(s); {args.reps} reps")
    rows: dict[str, list[dict[str, float]]] = {"torchrun": [], "profile": []}
    with tempfile.TemporaryDirectory(prefix="syncscope-bench-gpu-") as tmp:
        for rep in range(args.reps):
            order = launches if rep % 2 == 0 else launches[::-1]
            for launch in order:
                try:
                    record = launch.run(WORKLOADS / "no_sync.py", workload, Path(tmp))
                except LaunchFailed as exc:
                    print(f"bench_gpu: error: {exc}", file=sys.stderr)
                    return 1
                rows[launch.launcher].append(
                    {
                        "window_s": statistics.median(record["window_s"]),
                        "cpu_s": statistics.median(record["window_cpu_s"]),
                    }
                )
    plain, profiled = rows["torchrun"], rows["profile"]
    paired = [p["window_s"] / q["window_s"] for p, q in zip(profiled, plain, strict=True)]
    cpu = [p["cpu_s"] / q["cpu_s"] for p, q in zip(profiled, plain, strict=True)]
    print("| launch | window ms (median) | CPU ms (median) |")
    print("|---|---:|---:|")
    for name, runs in rows.items():
        window = statistics.median(r["window_s"] for r in runs) * 1e3
        cpu_ms = statistics.median(r["cpu_s"] for r in runs) * 1e3
        print(f"| {name} | {window:.2f} | {cpu_ms:.2f} |")
    ratio = statistics.median(paired)
    verdict = "within" if ratio <= LIMIT else "over"
    print(
        f"capture cost: paired window ratio x{ratio:.3f} (min {min(paired):.3f}, "
        f"max {max(paired):.3f}), CPU x{statistics.median(cpu):.3f}; "
        f"limit x{LIMIT}: {verdict} the limit"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
