"""Run an examples/ script as a benchmark workload, the example itself unchanged.

    python benchmarks/workloads/run_example.py EXAMPLE.py [ARGS...]

The examples are plain user scripts; this wraps one from outside. It imports the example's
own ``common`` (the module beside it), hands its ``parse_args``, ``batch`` and ``report`` to
``_bench.ExampleBench`` (this folder's options and sizes, the data made before the clock
starts, a window ended at every ``report``, the ``SYNCSCOPE_BENCH`` line after the last), and
runs the example as ``__main__`` with ``sys.argv`` as if it had been started itself. The
harness (``_harness.Launch``) starts every example workload this way.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

from _bench import ExampleBench


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0 if len(sys.argv) > 1 else 2)
    script = Path(sys.argv[1]).resolve()
    sys.argv = [str(script), *sys.argv[2:]]
    sys.path.insert(0, str(script.parent))  # the example's own ``common``, as it imports it
    import common

    bench = ExampleBench()

    def parse_args() -> argparse.Namespace:
        return bench.parse_args(common.arg_parser())

    def batch(args: argparse.Namespace, rank: int, step: int, micro: int) -> object:
        return bench.batch(args, rank, micro)

    def report(args: argparse.Namespace, rank: int, step: int, loss: float) -> None:
        bench.report(args, rank, step)

    common.parse_args, common.batch, common.report = parse_args, batch, report
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
