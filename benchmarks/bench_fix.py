"""`syncscope fix` time against the number of loops in one file, and against its length
(linear in the loops; a long file costs about its loops).

    python benchmarks/bench_fix.py [--loops 100 400] [--lines 20000 200000] [--reps 1]
    python benchmarks/bench_fix.py --loops --lines 2000 --reps 5  # a training file: < 1 s

Loops: each file holds N accumulation loops, each in its own function with its own DDP
model (the shape that was quadratic), fixed in this process; prints the seconds per size and
the ratio of the largest to the smallest, against the ratio of their sizes.

Lines: a script of about L lines holding a few accumulation loops (each in a function whose
``no_sync`` covers the backward only: rewritten) among L lines of functions, classes,
comments and plain statements. Each point is a fresh process (``syncscope fix FILE``, the
dry run, ``syncscope fix --check FILE``, then ``syncscope fix --apply FILE``): wall and CPU seconds (median of ``--reps``)
and the peak RSS of the process. The applied file is checked to keep every padding line.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HEADER = "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
# one accumulation loop with no_sync() around backward only, as a function: {i} numbers it
LOOP = (ROOT / "tests" / "fixtures" / "no_sync_backward_only_loop.txt").read_text()
PADDING = '''
def helper_{i}(x, scale={i}):
\t"""Scale ``x``: padding {i}, indented with tabs."""
\ty = x * scale
\treturn y + 1
\x0c
# a comment after a form feed {i}
value_{i} = torch.zeros({k}) * {i}


class Thing_{i}:
    size = {i}

    def grow(self):
        return self.size + value_{i}.numel()
'''
FOOTER = "\nmodel = DDP(torch.nn.Linear(2, 2))\n"


def long_file(lines: int, loops: int = 3) -> str:
    """A script of about ``lines`` lines: ``loops`` accumulation loops spread among padding."""
    chunks = max(lines // PADDING.count("\n"), loops)
    every = chunks // loops
    parts = [HEADER]
    for i in range(chunks):
        if i % every == every // 2 and i // every < loops:
            parts.append(LOOP.format(i=i // every))
        parts.append(PADDING.format(i=i, k=i % 7 + 1))
    return "".join(parts) + FOOTER


def _run(path: Path, *flags: str) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, peak RSS MiB) of one ``syncscope fix`` in a child process
    (CPU time is steadier than wall time on a shared machine)."""
    code = (
        "import resource, sys\n"
        "from syncscope import cli\n"
        "status = cli.main(['fix', *sys.argv[1:]])\n"
        "use = resource.getrusage(resource.RUSAGE_SELF)\n"
        "print(use.ru_utime + use.ru_stime, use.ru_maxrss, file=sys.stderr)\n"
        "sys.exit(status)\n"
    )
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code, *flags, path.name],
        capture_output=True,
        text=True,
        cwd=path.parent,
    )
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"syncscope fix failed on {path}: {done.stderr.strip()[-400:]}")
    cpu, peak_kib = done.stderr.strip().splitlines()[-1].split()
    return wall, float(cpu), int(peak_kib) / 1024


def _lines(n: int, reps: int, tmp: Path) -> None:
    text = long_file(n)
    path = tmp / f"long{n}.py"
    modes = (("dry run", ()), ("--check", ("--check",)), ("--apply", ("--apply", "--no-backup")))
    for label, flags in modes:
        runs = []
        for _ in range(reps):
            path.write_text(text)
            runs.append(_run(path, *flags))
        wall = statistics.median(w for w, _, _ in runs)
        cpu = statistics.median(c for _, c, _ in runs)
        peak = max(p for _, _, p in runs)
        lines = text.count("\n")
        print(f"{lines:8d} lines, {label:>8}: {wall:6.2f} s wall {cpu:6.2f} s CPU {peak:6.0f} MiB")
    fixed = path.read_text()
    kept = all(part in fixed for part in text.split(LOOP.format(i=0))[0].split("\n\n"))
    print(f"          applied: {fixed.count('is_last')} is_last, padding intact: {kept}")


def loop_functions(n: int) -> str:
    """``n`` accumulation loops, each in its own function with its own DDP model."""
    loops = [
        f"""
def train{k}(loader):
    model{k} = DDP(torch.nn.Linear(4, 4))
    optimizer{k} = torch.optim.SGD(model{k}.parameters(), lr=0.1)
    for i, batch in enumerate(loader):
        loss = model{k}(batch).sum() / accum
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer{k}.step()
            optimizer{k}.zero_grad()
"""
        for k in range(n)
    ]
    return HEADER + "\naccum = 4\n" + "\n".join(loops)


def _loops(counts: list[int]) -> None:
    from syncscope.fixes.codemod import FixOptions, fix_source

    times: list[float] = []
    for n in counts:
        source = loop_functions(n)
        start = time.perf_counter()
        result = fix_source(source, FixOptions(), path=f"loops{n}.py")
        times.append(time.perf_counter() - start)
        print(
            f"{n:5d} loops, {source.count(chr(10)):6d} lines: {times[-1]:6.2f} s "
            f"({len(result.problems)} problems)"
        )
    if len(times) > 1:
        size = counts[-1] / counts[0]
        print(f"time x{times[-1] / times[0]:.2f} for x{size:.0f} the loops")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--loops", type=int, nargs="*", default=[100, 400])
    parser.add_argument("--lines", type=int, nargs="*", default=[20_000, 200_000])
    parser.add_argument("--reps", type=int, default=1)
    args = parser.parse_args()
    if args.loops:
        _loops(args.loops)
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.lines:
            _lines(n, args.reps, Path(tmp))


if __name__ == "__main__":
    main()
