"""``syncscope diff RUN_A RUN_B``: before/after comparison in the terminal and as HTML.

The work is syncscope/reporting.py's.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from syncscope.cli import Parser

SUMMARY = (
    "Compare two runs: grad syncs, bytes, window time, peak memory, findings resolved and new."
)


def add_parser(subparsers: argparse._SubParsersAction[Parser]) -> None:
    parser = subparsers.add_parser("diff", help=SUMMARY, description=SUMMARY, allow_abbrev=False)
    parser.add_argument("run_a", type=Path, metavar="RUN_A", help="The run before the change.")
    parser.add_argument("run_b", type=Path, metavar="RUN_B", help="The run after the change.")
    parser.add_argument(
        "--html", type=Path, metavar="FILE", help="Also write the comparison as an HTML page."
    )
    parser.add_argument(
        "--color",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Colour the output (default: on a terminal).",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from syncscope.reporting import diff

    diff(args.run_a, args.run_b, args.html, args.color)
