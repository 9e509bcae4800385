"""Benchmark: ``syncscope analyze`` vs HTA's ``TraceAnalysis(trace_dir=...)`` load alone.

Each measurement runs the command in a fresh process and samples its whole process tree
(the command and any worker processes it starts) every 20 ms: wall seconds, and the peak of
the tree's summed RSS and summed PSS (``/proc/PID/smaps_rollup``; PSS splits shared pages
such as libpython between the processes that map them, RSS counts them once per process).
The tools run side by side, alternating (ABAB...), and the medians are printed, so load from
other jobs on the machine hits both alike. Sets: the real traces in ../shared/data/kineto
(when present) and synthetic DDP jobs of 8 and 64 ranks x 50 MB (written to a temp dir, or
read from --synthetic-dir; the 64-rank set is opt-in: --big).

    python benchmarks/bench_analyze.py [--big] [--mb 50] [--reps 3] [--no-hta-synthetic]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "kineto"
sys.path.insert(0, str(ROOT))  # this checkout's syncscope, as the measured commands use
REAL_SETS = ("df_index_resolver", "nccl_parser_config")
HTA_LOAD = (
    "import logging, sys; logging.disable(logging.CRITICAL)\n"
    "from hta.trace_analysis import TraceAnalysis\n"
    "TraceAnalysis(trace_dir=sys.argv[1])\n"
)


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (Linux: /proc/PID/task/TID/children)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except OSError:
                continue
    return found


def _tree_kib(pid: int) -> tuple[int, int]:
    """Summed (RSS, PSS) KiB of ``pid`` and its descendants."""
    rss = pss = 0
    for p in _descendants(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1])
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1])
        except OSError:
            continue
    return rss, pss


# Runs ``python -m MODULE ARGS`` or ``python -c CODE ARGS`` and, at exit, writes the process's
# own peak RSS (VmHWM: the high-water mark of its memory since exec) to the file named first.
# The kernel's ru_maxrss would not do: it keeps the RSS of the benchmark process it was
# forked from.
_HWM = (
    "import atexit, sys\n"
    "def _hwm(path=sys.argv.pop(1)):\n"
    "    with open('/proc/self/status') as f:\n"
    "        kib = next(line.split()[1] for line in f if line.startswith('VmHWM:'))\n"
    "    with open(path, 'w') as f:\n"
    "        f.write(kib)\n"
    "atexit.register(_hwm)\n"
    "mode, target = sys.argv.pop(1), sys.argv.pop(1)\n"
    "if mode == '-m':\n"
    "    import runpy\n"
    "    sys.argv[0] = target\n"
    "    runpy.run_module(target, run_name='__main__', alter_sys=True)\n"
    "else:\n"
    "    exec(compile(target, '<string>', 'exec'), {'__name__': '__main__'})\n"
)


def measure(mode: str, target: str, *args: str) -> tuple[float, float, float]:
    """(wall seconds, peak tree RSS MiB, peak tree PSS MiB) of ``python MODE TARGET ARGS``
    (MODE ``-m`` or ``-c``) in a fresh process.

    The process tree (the command and any workers it starts) is sampled every 20 ms for
    summed RSS and PSS; the command's own peak RSS is also taken exactly (VmHWM at exit), so
    a short peak between two samples is not missed. PSS is sampled only.
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        hwm_path = Path(tmp, "hwm")
        err_path = Path(tmp, "stderr")
        cmd = [sys.executable, "-c", _HWM, str(hwm_path), mode, target, *args]
        with err_path.open("wb") as err_file:
            start = time.perf_counter()
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err_file)
            peak_rss = peak_pss = 0
            while proc.poll() is None:
                rss, pss = _tree_kib(proc.pid)
                peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
                time.sleep(0.02)
            wall = time.perf_counter() - start
        err = err_path.read_text(errors="replace")
        if proc.returncode not in (0, 1):
            raise RuntimeError(f"{target[:40]} failed: {err.strip().splitlines()[-1:]}")
        peak_rss = max(peak_rss, int(hwm_path.read_text()))
    return wall, peak_rss / 1024, peak_pss / 1024


def hta_ranks(trace_dir: Path) -> int:
    """How many ranks HTA finds in ``trace_dir`` (it reads each file's rank with a regex)."""
    import logging

    from hta.common.trace_file import create_rank_to_trace_dict_from_dir

    logging.disable(logging.CRITICAL)
    return len(create_rank_to_trace_dict_from_dir(str(trace_dir))[1])


def syncscope_cmd(trace_dir: Path, out: Path) -> list[str]:
    return ["-m", "syncscope", "analyze", str(trace_dir), "--quiet",
            "--fail-on", "never", "--out", str(out)]  # fmt: skip


def uncompressed_mib(trace_dir: Path) -> float:
    import gzip

    largest = 0
    for p in trace_dir.iterdir():
        if p.name.endswith(".gz"):
            with gzip.open(p, "rb") as f:
                size = sum(len(b) for b in iter(lambda f=f: f.read(1 << 20), b""))  # type: ignore[misc]
        else:
            size = p.stat().st_size
        largest = max(largest, size)
    return largest / (1 << 20)


def row(name: str, trace_dir: Path, tmp: Path, hta: bool, reps: int) -> None:
    largest = uncompressed_mib(trace_dir)
    files = len(list(trace_dir.iterdir()))
    ours: list[tuple[float, float, float]] = []
    theirs: list[tuple[float, float, float]] = []
    for i in range(reps):  # ABAB: each tool sees the same machine load
        ours.append(measure(*syncscope_cmd(trace_dir, tmp / f"out-{name}-{i}")))
        if hta:
            theirs.append(measure("-c", HTA_LOAD, str(trace_dir)))
    t, rss, pss = (statistics.median(x[k] for x in ours) for k in range(3))
    text = (
        f"{name:22s} {files:2d} files, largest {largest:5.1f} MiB | syncscope analyze "
        f"{t:6.2f} s, tree RSS {rss:5.1f} MiB ({rss / largest:4.2f}x largest), "
        f"PSS {pss:5.1f} MiB ({pss / largest:4.2f}x)"
    )
    if theirs:
        ht, hrss, _ = (statistics.median(x[k] for x in theirs) for k in range(3))
        text += f" | HTA load {ht:6.2f} s, {hrss:5.0f} MiB | {ht / t:4.1f}x faster"
    else:
        text += " | HTA load skipped"
    times = ", ".join(f"{x[0]:.2f}" for x in ours)
    hta_times = ", ".join(f"{x[0]:.2f}" for x in theirs)
    print(text, flush=True)
    print(f"{'':22s} runs: syncscope [{times}]" + (f", HTA [{hta_times}]" if theirs else ""))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--big", action="store_true", help="also the 64-rank set (3.2 GB)")
    parser.add_argument("--mb", type=float, default=50.0)
    parser.add_argument("--reps", type=int, default=3, help="alternating runs per tool")
    parser.add_argument("--big-reps", type=int, default=1)
    parser.add_argument("--no-hta-synthetic", action="store_true", help="HTA on real traces only")
    parser.add_argument("--hta-big", action="store_true", help="HTA on the 64-rank set too")
    parser.add_argument("--synthetic-dir", type=Path, help="reuse synthetic-R dirs here")
    parser.add_argument("--only", choices=("real", "synthetic"), help="one kind of set")
    args = parser.parse_args()
    from tests.helpers.synth_traces import write_job

    kind = "a virtual environment" if sys.prefix != sys.base_prefix else "no virtual environment"
    print(f"python {sys.executable} ({kind})", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    t, rss, _ = measure("-c", "pass")
    print(f"bare interpreter (python -c pass): {t:.2f} s, {rss:.1f} MiB RSS", flush=True)
    t, rss, _ = measure("-m", "syncscope", "--help")
    print(f"syncscope CLI start-up alone: {t:.2f} s, {rss:.1f} MiB RSS", flush=True)
    with tempfile.TemporaryDirectory(prefix="syncscope-bench-") as tmp_name:
        tmp = Path(tmp_name)
        if SHARED.is_dir() and args.only != "synthetic":
            for d in REAL_SETS:
                if (SHARED / d).is_dir():
                    row(d, SHARED / d, tmp, hta=True, reps=args.reps)
        sets = [] if args.only == "real" else [8, 64] if args.big else [8]
        for ranks in sets:
            job = (args.synthetic_dir or tmp) / f"synthetic-{ranks}"
            if not (job.is_dir() and len(list(job.iterdir())) == ranks):
                write_job(job, ranks, int(args.mb * (1 << 20)))
            hta = not args.no_hta_synthetic and (ranks <= 8 or args.hta_big)
            if hta and (seen := hta_ranks(job)) != ranks:
                print(f"HTA sees {seen} of the {ranks} ranks in {job}: regenerate it", flush=True)
                return 1
            reps = args.reps if ranks <= 8 else args.big_reps
            row(f"synthetic {ranks} x {args.mb:g} MB", job, tmp, hta, reps)
        print(f"load average {os.getloadavg()[0]:.1f} at the end", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
