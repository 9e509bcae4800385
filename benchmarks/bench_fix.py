"""`syncscope fix` time against the number of loops in one file (issue 28: linear).

    python benchmarks/bench_fix.py [--loops 100 400]

Each file holds N accumulation loops, each in its own function with its own DDP model
(the shape that was quadratic). Prints the seconds per size and the ratio of the largest
to the smallest, against the ratio of their sizes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from syncscope.fixes.codemod import FixOptions, fix_source
from tests.faults.test_faults_fix import _functions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--loops", type=int, nargs="+", default=[100, 400])
    args = parser.parse_args()
    times: list[float] = []
    for n in args.loops:
        source = _functions(n)
        start = time.perf_counter()
        result = fix_source(source, FixOptions(), path=f"loops{n}.py")
        times.append(time.perf_counter() - start)
        print(
            f"{n:5d} loops, {source.count(chr(10)):6d} lines: {times[-1]:6.2f} s "
            f"({len(result.problems)} problems)"
        )
    if len(times) > 1:
        size = args.loops[-1] / args.loops[0]
        print(f"time x{times[-1] / times[0]:.2f} for x{size:.0f} the loops")


if __name__ == "__main__":
    main()
