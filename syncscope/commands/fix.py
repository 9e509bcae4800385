"""``syncscope fix SCRIPT``: propose (or apply) rewrites of gradient-accumulation loops.

Dry run by default: a unified diff on stdout and one line per problem on stderr. Exit
status: 0 nothing to fix, 1 problems found (dry run) or left unfixed (``--apply``), 2 error.
The work is syncscope/fixes/pipeline.py's.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from syncscope.fixes.styles import STYLES

if TYPE_CHECKING:
    from syncscope.cli import Parser

SUMMARY = "Propose (dry run) or --apply fixes to gradient-accumulation loops."


def add_parser(subparsers: argparse._SubParsersAction[Parser]) -> None:
    parser = subparsers.add_parser(
        "fix",
        help=SUMMARY,
        description=SUMMARY,
        usage="%(prog)s [OPTIONS] SCRIPT [SCRIPT_ARGS...]",
        allow_abbrev=False,
    )
    # after SCRIPT, fix's own options (--apply, --verify, ...) are still fix's; every other
    # argument, options included, is SCRIPT's (for --verify), as with ``profile``
    parser.script_arguments = True
    parser.add_argument(
        "script",
        type=Path,
        metavar="SCRIPT",
        help="Training script to check and fix; the arguments after it that are not fix's "
        "own options are the script's (for --verify); after -- all are.",
    )
    parser.add_argument("--apply", action="store_true", help="Write the change.")
    parser.add_argument(
        "--style",
        default="auto",
        choices=STYLES,
        metavar="STYLE",
        help="%(choices)s. (default: %(default)s)",
    )
    parser.add_argument(
        "--from",
        dest="from_run",
        type=Path,
        metavar="RUN_DIR",
        help="Run directory of `syncscope profile`.",
    )
    parser.add_argument(
        "--verify", action="store_true", help="Profile original and fixed, side by side."
    )
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=2,
        metavar="N",
        help="Ranks for --verify. (default: %(default)s)",
    )
    parser.add_argument("--no-backup", action="store_true", help="No SCRIPT.bak.")
    parser.add_argument(
        "--allow-outside", action="store_true", help="Write a file outside the cwd."
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from syncscope.fixes.pipeline import fix

    return fix(
        args.script,
        args.program,
        apply=args.apply,
        style=args.style,
        from_run=args.from_run,
        verify=args.verify,
        nproc_per_node=args.nproc_per_node,
        backup=not args.no_backup,
        allow_outside=args.allow_outside,
    )
