"""``syncscope diff RUN_A RUN_B``: before/after comparison in the terminal and as HTML."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from syncscope.commands import report as report_command


def labels_for(a: Path, b: Path) -> tuple[str, str]:
    """Short names for the two runs: directory names, or the paths as given where those clash."""
    return (a.name, b.name) if a.name and b.name and a.name != b.name else (str(a), str(b))


def diff(
    run_a: Annotated[Path, typer.Argument(help="The run before the change.")],
    run_b: Annotated[Path, typer.Argument(help="The run after the change.")],
    html: Annotated[
        Path | None, typer.Option("--html", help="Also write the comparison as an HTML page.")
    ] = None,
    color: Annotated[
        bool | None,
        typer.Option("--color/--no-color", help="Colour the output (default: on a terminal)."),
    ] = None,
) -> None:
    """Compare two runs: grad syncs, bytes, window time, peak memory, findings resolved and new."""
    from syncscope.render.diff import compare, render_diff_html, render_diff_text

    run_1, findings_1 = report_command.load_and_diagnose(run_a)
    run_2, findings_2 = report_command.load_and_diagnose(run_b)
    result = compare(run_1, findings_1, run_2, findings_2, labels=labels_for(run_a, run_b))
    use_color = sys.stdout.isatty() if color is None else color
    sys.stdout.write(render_diff_text(result, color=use_color))
    if html is not None:
        report_command.write_text(html, render_diff_html(result))
        print(f"syncscope: wrote {html}", file=sys.stderr)


def register(app: typer.Typer) -> None:
    app.command("diff")(diff)
