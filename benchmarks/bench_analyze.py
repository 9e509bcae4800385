"""Benchmark: ``syncscope analyze`` vs HTA's ``TraceAnalysis(trace_dir=...)`` load alone.

Each measurement runs in a fresh process under ``/usr/bin/time`` (wall seconds, peak RSS).
Sets: the real traces in ../shared/data/kineto (when present) and synthetic DDP jobs of
8 and 64 ranks x 50 MB (written to a temp dir; the 64-rank set is opt-in: --big).

    python benchmarks/bench_analyze.py [--big] [--mb 50] [--no-hta-synthetic]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "kineto"
CORE = (
    "import sys; from pathlib import Path\n"
    "from syncscope.trace.load import load_traces\n"
    "from syncscope.commands.analyze import findings_for\n"
    "findings_for(load_traces([Path(sys.argv[1])], skip_bad=True))\n"
)
HTA_LOAD = (
    "import logging, sys; logging.disable(logging.CRITICAL)\n"
    "from hta.trace_analysis import TraceAnalysis\n"
    "TraceAnalysis(trace_dir=sys.argv[1])\n"
)


def measure(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of ``cmd`` in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        ["/usr/bin/time", "-f", "@@ %e %M", *cmd],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    line = [x for x in proc.stderr.splitlines() if x.startswith("@@ ")]
    if not line:  # a bad-input exit (status 2) still has a time
        tail = proc.stderr.strip().splitlines()[-1:] or ["?"]
        raise RuntimeError(f"{cmd[:4]} failed: {tail[0]}")
    _, wall, rss_kib = line[-1].split()
    return float(wall), int(rss_kib) / 1024


def syncscope_cmd(trace_dir: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "syncscope", "analyze", str(trace_dir), "--quiet",
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


def row(name: str, trace_dir: Path, tmp: Path, hta: bool) -> None:
    largest = uncompressed_mib(trace_dir)
    files = len(list(trace_dir.iterdir()))
    ss_t, ss_m = measure(syncscope_cmd(trace_dir, tmp / f"out-{name}"))
    core_t, core_m = measure([sys.executable, "-c", CORE, str(trace_dir)])
    if hta:
        hta_t, hta_m = measure([sys.executable, "-c", HTA_LOAD, str(trace_dir)])
        ratio = f"{hta_t / ss_t:5.1f}x CLI, {hta_t / core_t:5.1f}x analysis"
        hta_text = f"{hta_t:7.2f} s {hta_m:8.0f} MiB"
    else:
        ratio, hta_text = "    -", "      (skipped)     "
    print(
        f"{name:24s} {files:2d} files, largest {largest:5.1f} MiB | CLI {ss_t:6.2f} s "
        f"{ss_m:4.0f} MiB | analysis {core_t:6.2f} s {core_m:4.0f} MiB "
        f"({core_m / largest:4.2f}x largest) | HTA load {hta_text} | {ratio}",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--big", action="store_true", help="also the 64-rank set (3.2 GB)")
    parser.add_argument("--mb", type=float, default=50.0)
    parser.add_argument("--no-hta-synthetic", action="store_true", help="HTA on real traces only")
    parser.add_argument("--hta-big", action="store_true", help="HTA on the 64-rank set too")
    args = parser.parse_args()
    from syncscope.trace.synth import write_job

    baseline_t, baseline_m = measure([sys.executable, "-m", "syncscope", "--help"])
    print(f"syncscope CLI start-up alone: {baseline_t:.2f} s, {baseline_m:.0f} MiB")
    with tempfile.TemporaryDirectory(prefix="syncscope-bench-") as tmp_name:
        tmp = Path(tmp_name)
        if SHARED.is_dir():
            for d in sorted(SHARED.iterdir()):
                if d.is_dir():
                    row(d.name, d, tmp, hta=True)
        sets = [8, 64] if args.big else [8]
        for ranks in sets:
            job = tmp / f"synthetic-{ranks}"
            write_job(job, ranks, int(args.mb * (1 << 20)))
            hta = not args.no_hta_synthetic and (ranks <= 8 or args.hta_big)
            row(f"synthetic {ranks} x {args.mb:g} MB", job, tmp, hta)
            for p in job.iterdir():
                p.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
