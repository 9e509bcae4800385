"""``syncscope diff RUN_A RUN_B``: before/after comparison in the terminal and as HTML.

Both runs are read and diagnosed as ``report`` reads one; the comparison is
syncscope/render/diff.py's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from syncscope.cli import Parser
    from syncscope.model import RunMeta

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
    from syncscope.load.trace.read import collector_paused

    with collector_paused():  # (runs of thousands of ranks: see analyze)
        diff(args.run_a, args.run_b, args.html, args.color)


def diff(run_a: Path, run_b: Path, html: Path | None = None, color: bool | None = None) -> None:
    """Compare two runs on stdout (coloured on a terminal by default), and as an HTML page
    in ``html``."""
    from syncscope.commands.saved import load_and_diagnose
    from syncscope.render.diff import compare, render_diff_html, render_diff_text
    from syncscope.text import visible

    run_1, findings_1 = load_and_diagnose(run_a)
    run_2, findings_2 = load_and_diagnose(run_b)
    for warning in _mismatches(run_1.meta, run_2.meta):
        print(visible(f"syncscope: warning: {warning}"), file=sys.stderr)
    result = compare(run_1, findings_1, run_2, findings_2, labels=_labels(run_a, run_b))
    use_color = sys.stdout.isatty() if color is None else color
    sys.stdout.write(render_diff_text(result, color=use_color))
    if html is not None:
        from syncscope.atomic import write_output

        write_output(html, render_diff_html(result).encode("utf-8"))
        print(visible(f"syncscope: wrote {html}"), file=sys.stderr)


def _labels(a: Path, b: Path) -> tuple[str, str]:
    """Short names for the two runs: directory names, or the paths as given where those clash."""
    return (a.name, b.name) if a.name and b.name and a.name != b.name else (str(a), str(b))


_MEASURED = {
    "live": "a live capture (syncscope profile: its hooks' clocks)",
    "trace": "a torch.profiler trace set (the profiler's events)",
}


def _mismatches(a: RunMeta, b: RunMeta) -> list[str]:
    """What makes the two runs' figures not directly comparable (said before the diff)."""
    out: list[str] = []
    if a.world_size != b.world_size:
        out.append(
            f"the runs have different world sizes ({a.world_size} vs {b.world_size}): "
            "time and bytes differences are not a like-for-like speed-up"
        )
    if a.source != b.source:
        out.append(
            f"the first is {_MEASURED[a.source]}, the second {_MEASURED[b.source]}: the two "
            "are measured differently, and traces name no script, so nothing shows they are "
            "the same job"
        )
    name_a, name_b = Path(a.script).name, Path(b.script).name
    if name_a and name_b and name_a != name_b and not name_b.endswith(name_a):
        out.append(f"the runs are of different scripts ({name_a} vs {name_b})")
    return out
