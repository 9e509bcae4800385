"""The cost of torch's Flight Recorder, which ``syncscope profile`` turns on in the ranks,
beside plain capture (the recorder off) and plain torchrun.

    python benchmarks/bench_flight.py [--reps 6] [--quick]

Four ways alternate, rotated every repetition: torchrun with the recorder off and on, and
``syncscope profile`` with it off (``TORCH_FR_BUFFER_SIZE=0``, what a user who turns it off
gets) and on (``profile``'s default, ``TORCH_FR_BUFFER_SIZE=2000``). Two workloads: the DDP
``no_sync`` loop of the capture-cost section (one bucket round per window) and the
collective-heavy loop that all-reduces every parameter after every micro-batch (8 layers x 2
parameters x 4 micro-batches = 64 all-reduces a window), where a per-collective cost shows.
Window time is rank 0's median over the timed windows; the ratios are of medians over the
repetitions, with each repetition's on/off ratio's range.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Launch, rotated, workload

MODES = {
    "torchrun, recorder off": (Launch("torchrun"), "0"),
    "torchrun, recorder on": (Launch("torchrun"), "2000"),
    "profile, recorder off": (Launch("profile"), "0"),
    "profile, recorder on (default)": (Launch("profile"), "2000"),
}
ARGS = ["--layers", "8", "--hidden", "512", "--batch", "32", "--accum", "4", "--warmup", "2"]


def measure(
    script: Path, reps: int, windows: int, work: Path
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(window seconds, rank 0's CPU seconds per window) by mode, one value a repetition."""
    times: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    for rep in range(reps):
        for mode in rotated(list(MODES), rep):
            launch, size = MODES[mode]
            env = {"TORCH_FR_BUFFER_SIZE": size}
            record = launch.start(script, [*ARGS, "--windows", str(windows)], work, env).collect()
            times[mode].append(statistics.median(record["window_s"]))
            cpu[mode].append(statistics.median(record["window_cpu_s"]))
    return times, cpu


def report(name: str, times: dict[str, list[float]]) -> None:
    print(f"\n{name}")
    med = {m: statistics.median(v) for m, v in times.items()}
    for mode, values in times.items():
        print(f"  {mode:32s} {med[mode] * 1e3:8.2f} ms/window  (n={len(values)})")
    for launcher in ("torchrun", "profile"):
        off = times[f"{launcher}, recorder off"]
        on = times[next(m for m in MODES if m.startswith(f"{launcher}, recorder on"))]
        pairs = [b / a for a, b in zip(off, on, strict=True)]
        print(
            f"  {launcher}: recorder on / off x{statistics.median(on) / statistics.median(off):.3f}"
            f" (per repetition {min(pairs):.3f}-{max(pairs):.3f})"
        )


PER_COLLECTIVE = """
import os, tempfile, time, torch, torch.distributed as dist
store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
t = torch.ones(1)
for _ in range(500):
    dist.all_reduce(t)
wall, cpu = time.perf_counter(), time.process_time()
for _ in range(N):
    dist.all_reduce(t)
print((time.perf_counter() - wall) / N * 1e6, (time.process_time() - cpu) / N * 1e6, flush=True)
dist.destroy_process_group()
"""


def per_collective(reps: int, n: int = 5000) -> dict[str, list[tuple[float, float]]]:
    """One gloo rank (world size 1), ``n`` blocking 1-element all-reduces after 500 warm-up
    ones, in a fresh process per measurement, the recorder off and on alternately: the
    recorder's own cost per collective (its entry and the Python stack it captures).
    Printed, and returned: (wall, CPU) microseconds per collective, one pair a measurement,
    by ``TORCH_FR_BUFFER_SIZE`` ("0": off, "2000": on)."""
    import os
    import subprocess

    found: dict[str, list[tuple[float, float]]] = {"0": [], "2000": []}
    for rep in range(reps):
        for size in rotated(list(found), rep):
            env = {**os.environ, "TORCH_FR_BUFFER_SIZE": size, "OMP_NUM_THREADS": "1"}
            code = f"N = {n}\n{PER_COLLECTIVE}"
            proc = subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
            )
            out = proc.stdout.split()
            if len(out) != 2:  # an abort in gloo's teardown after the line is no failure
                tail = proc.stderr.strip().splitlines()[-1:]
                raise RuntimeError(f"the per-collective loop exited {proc.returncode}: {tail}")
            found[size].append((float(out[0]), float(out[1])))
    print("\nper collective (1 gloo rank, 1-element all-reduce, us: wall / CPU, medians)")
    for size, values in found.items():
        wall = statistics.median(v[0] for v in values)
        cpu = statistics.median(v[1] for v in values)
        print(f"  TORCH_FR_BUFFER_SIZE={size:5s} {wall:7.1f} / {cpu:7.1f}  (n={len(values)})")
    on, off = found["2000"], found["0"]
    extra = [b[1] - a[1] for a, b in zip(off, on, strict=True)]
    print(
        f"  the recorder's CPU per collective, paired by repetition: {statistics.median(extra):.1f} us "
        f"(range {min(extra):.1f}-{max(extra):.1f})"
    )
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--quick", action="store_true", help="1 repetition, 3 windows")
    parser.add_argument(
        "--only-per-collective", action="store_true", help="only the one-rank per-collective cost"
    )
    parser.add_argument(
        "--workloads",
        nargs="+",
        default=["no_sync", "per_param_every_microbatch"],
        metavar="SCRIPT",
        help="configurations (_harness.workload: an example or benchmarks/workloads/NAME.py; "
        "default: %(default)s)",
    )
    opts = parser.parse_args()
    reps, windows = (1, 3) if opts.quick else (opts.reps, 8)
    per_collective(max(reps, 3))
    if opts.only_per_collective:
        return 0
    with tempfile.TemporaryDirectory(prefix="syncscope-bench-fr-") as tmp:
        for name in opts.workloads:
            times, cpu = measure(workload(name), reps, windows, Path(tmp))
            report(f"{name}: window time", times)
            report(f"{name}: CPU time of rank 0 per window", cpu)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
