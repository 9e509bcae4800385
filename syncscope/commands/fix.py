"""``syncscope fix SCRIPT``: propose (or apply) rewrites of gradient-accumulation loops.

Dry run by default: a unified diff on stdout and one line per problem on stderr. Exit
status: 0 nothing to fix, 1 problems found (dry run) or left unfixed (``--apply``), 2 error.
``--check PATH...``: the problems of every file given or under every directory given, on
stdout, nothing written (syncscope/fixes/check.py): for CI and pre-commit.
The work is syncscope/fixes/driver.py's.
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
        "--check",
        action="store_true",
        help="CI/pre-commit check: SCRIPT and the arguments after it are files or directories; "
        "read the code only, print file:line: SYNxxx message per loop it would rewrite; exit 1 "
        "if any, 0 if none, 2 on bad input.",
    )
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
    if args.check:
        return _check(args)
    from syncscope.fixes.driver import fix

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


def _check(args: argparse.Namespace) -> int:
    from syncscope.errors import SyncscopeError
    from syncscope.fixes.check import check_paths

    others = [
        f"--{k.replace('_', '-')}" for k in ("apply", "verify", "from_run") if getattr(args, k)
    ]
    if others:
        raise SyncscopeError(f"--check reads the code only: it does not take {', '.join(others)}")
    return check_paths([args.script, *(Path(p) for p in args.program)])
