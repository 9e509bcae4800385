"""The README's example output is what the README's first command prints.

The command runs for real (2 CPU ranks); the README block must match its output with the
numbers (timings differ run to run) and the line wrapping (it follows the numbers' widths)
left out of the comparison, so column names, row grouping, card lines and the cost line
cannot drift. ``SYNCSCOPE_UPDATE_README=1`` rewrites the block from the run.
"""

from __future__ import annotations

import os
import re

import pytest

from tests.conftest import ROOT, run_syncscope

pytestmark = pytest.mark.slow

README = ROOT / "README.md"
OPTIONS = ("profile", "--nproc-per-node", "2")
# the bundled example at a size where communication weighs as in a real model: what the
# README's demo projects, `fix --verify` then measures (the defaults are tiny, for tests)
SCRIPT = ("examples/ddp_no_sync_backward_only.py", "--hidden", "1024", "--layers", "8")
COMMAND = (*OPTIONS, *SCRIPT, "--steps", "6")
START = "What the first command prints (the script's own `step N loss X` lines left out):\n\n```\n"


def _block(text: str) -> tuple[int, int]:
    start = text.index(START) + len(START)
    return start, text.index("```\n", start)


# what depends on how fast the machine ran the job: the table's rows (windows set apart as
# warm-up or outliers group differently), the window-time lines, the projection's words
# (its paragraph whole: _flat)
_TIMING = re.compile(r"warm-up|apart|project|window time|median|window N ms|-> ~|N ms")
_NUMBER = re.compile(r"\d+(\.\d+)?")  # every figure reads "N" where text is compared


def _without_wrapped_timing(text: str) -> str:
    """A card's timing-dependent field wraps where its numbers' widths say (a CI run printed
    "window time not projected: ... (interquartile range 1.8 ms vs 1.5 ms" and then "saved)"
    on a line of its own): a card line that goes on such a field, one with no ``label:`` of
    its own, goes with it."""
    kept: list[str] = []
    dropping = False
    for line in text.splitlines():
        inside = line.strip().strip("│").strip()
        card_line = line.startswith("│") and line.rstrip().endswith("│")
        timing = bool(_TIMING.search(_NUMBER.sub("N", inside)))
        if dropping and card_line and inside and not re.match(r"[\w-]+( [\w-]+)*:", inside):
            continue  # the wrapped rest of a timing field
        dropping = card_line and timing
        kept.append(line)
    return "\n".join(kept)


def _flat(text: str) -> list[str]:
    """Words with box drawing, line breaks, numbers and timing-dependent lines taken out:
    what stays (column names, labels, card titles, causes, sources and fixes) must match.
    The projection paragraph goes whole, its wrapped lines too: made or omitted by speed."""
    text = re.sub(r"^projected speed-up.*?(?=^╭)", "", text, flags=re.S | re.M)
    text = _without_wrapped_timing(text)
    text = re.sub(r"[─━│┃┏┓┗┛┡┩└┘┳┻╇┼╭╮╰╯┬┴├┤]", " ", text)
    text = _NUMBER.sub("N", text)
    lines = [" ".join(line.split()) for line in text.splitlines()]
    kept = [
        line
        for line in lines
        if line and not _TIMING.search(line) and not re.match(r"N(-N)? N", line)
    ]
    return " ".join(kept).split()


def _relative(line: str) -> str:
    """The line with the checkout's path taken out, a card's border kept in place."""
    prefix = f"{ROOT}/"
    if prefix not in line:
        return line.rstrip()
    short = line.replace(prefix, "")
    if short.endswith("│"):
        short = short[:-1] + " " * (len(line) - len(short)) + "│"
    return short.rstrip()


def test_readme_example_output_is_what_the_command_prints(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # GIVEN the README's first command, as the README gives it
    assert f"syncscope {' '.join(COMMAND)}\n" in README.read_text()
    # WHEN it runs (its run directory in a temporary place)
    proc = run_syncscope(*OPTIONS, "--out", str(tmp_path / "run"), *COMMAND[len(OPTIONS) :])
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = "".join(
        _relative(line) + "\n"
        for line in proc.stdout.splitlines()
        if not re.match(r"step \d+ loss ", line)
    )
    text = README.read_text()
    start, end = _block(text)
    if os.environ.get("SYNCSCOPE_UPDATE_README"):
        README.write_text(text[:start] + printed.rstrip() + "\n" + text[end:])
        text = README.read_text()
        start, end = _block(text)
    # THEN the README shows the same output, number for number in place
    assert _flat(text[start:end]) == _flat(printed), printed


def test_the_readme_checks_its_demo_with_fix_verify_on_the_same_run() -> None:
    """The demo proves what it claims: its `fix --verify` line profiles the same
    script with the same arguments as the first command, and shows a measured result."""
    text = README.read_text()
    script_and_args = " ".join(COMMAND[len(OPTIONS) :])
    assert f"syncscope fix --verify {script_and_args}\n" in text
    assert re.search(r"window time: [\d.]+x faster, beyond the noise", text)
