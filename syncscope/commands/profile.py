"""``syncscope profile``: run a script on N ranks, capture, diagnose and report.

The parser holds syncscope's own options and, added when this command line is parsed or its
help shown, every option of torch.distributed.run, read from torch's own parser
(syncscope/launch/torchrun.py). The run itself is syncscope/launch/job.py's.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from syncscope.render.outputs import FAIL_ON

if TYPE_CHECKING:
    from syncscope.cli import Parser

SUMMARY = "Run SCRIPT on N ranks through torch's launcher and account for every gradient sync."
LAUNCH = "Launcher (torch.distributed.run)"


def add_parser(subparsers: argparse._SubParsersAction[Parser]) -> None:
    parser = subparsers.add_parser(
        "profile",
        help=SUMMARY,
        description=SUMMARY,
        usage="%(prog)s [OPTIONS] SCRIPT [SCRIPT_ARGS...]\n"
        "       %(prog)s [OPTIONS] -m MODULE [ARGS...]",
        allow_abbrev=False,
    )
    # everything after SCRIPT, or after -m MODULE, belongs to the program, options included
    parser.program_options = ("-m", "--module")
    parser.add_argument(
        "program",
        nargs=argparse.REMAINDER,
        metavar="SCRIPT",
        help="SCRIPT [SCRIPT_ARGS...] (or, with -m, the module's arguments)",
    )
    parser.add_argument("-m", "--module", metavar="MODULE", help="Run a module, like python -m.")
    parser.add_argument(
        "--out",
        "-o",
        type=Path,
        metavar="DIR",
        help="Run directory (default syncscope-out/<name>-<timestamp>).",
    )
    parser.add_argument(
        "--fail-on",
        default="error",
        choices=FAIL_ON,
        metavar="LEVEL",
        help="Exit 1 on findings of this severity: %(choices)s. (default: %(default)s)",
    )
    parser.add_argument(
        "--hang-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="Seconds without progress (no rank writes an event, nothing of any rank computes: "
        "each main thread waits in torch.distributed or is idle, and its threads and child "
        "processes use no CPU) before the job is declared hung and stopped, or before ranks "
        "kept alive after the script's end by idle non-daemon threads are stopped (threads "
        "still computing are waited for up to 600 s) (0: never). (default: %(default)s)",
    )
    parser.add_argument(
        "--trace", action="store_true", help="Also record a torch.profiler trace on every rank."
    )
    parser.add_argument(
        "--trace-windows", metavar="A:B", help="Windows A:B to trace (with --trace)."
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="No terminal summary.")
    _add_bounds(parser)
    launcher = parser.add_argument_group(
        LAUNCH,
        "Every option of torch.distributed.run before SCRIPT passes through to it unchanged "
        "(-m is syncscope's own, above); help from torch.",
    )
    parser.late_arguments = lambda parser: _add_launcher_options(parser, launcher)
    parser.set_defaults(run=run)


def _add_bounds(parser: argparse.ArgumentParser) -> None:
    bounded = parser.add_argument_group(
        "Bounded capture",
        "Capture N windows (optimizer steps) after skipping W, then remove every hook.",
    )
    bounded.add_argument(
        "--windows", metavar="N", help="Capture N complete windows, then detach (default: all)."
    )
    bounded.add_argument(
        "--skip-windows", metavar="W", help="Windows to run uncaptured first (default: 0)."
    )
    bounded.add_argument(
        "--then",
        metavar="run|stop",
        help="After the N windows: run on to the job's end without hooks (default; the report "
        "is written at once) or stop every rank cleanly (SystemExit(0) at that step).",
    )


def _add_launcher_options(parser: argparse.ArgumentParser, group: argparse._ArgumentGroup) -> None:
    from syncscope.launch.torchrun import add_launcher_options  # imports torch: only now

    add_launcher_options(parser, group)


def run(args: argparse.Namespace) -> int:
    from syncscope.launch.job import Request, profile

    return profile(
        Request(
            program=args.program,
            module=args.module,
            launcher=args.launcher,
            out=args.out,
            fail_on=args.fail_on,
            hang_timeout=args.hang_timeout,
            trace=args.trace,
            trace_windows=args.trace_windows,
            quiet=args.quiet,
            windows=args.windows,
            skip_windows=args.skip_windows,
            then=args.then,
        )
    )
