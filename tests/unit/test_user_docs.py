"""docs/ speaks of the product as it is: no issue numbers, no "(was ...)" notes of what a
case did before, no rounds of work, nothing of the machines syncscope is developed on; each
page's section titles are its own (a link to a section finds one)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md", ROOT / "CONTRIBUTING.md"])
HISTORY = {
    "an issue number": re.compile(r"\bissues? \d+|\bissue's\b", re.I),
    "a note of what was before": re.compile(r"\(was\b|\(were\b|\bwas: ", re.I),
    "a round of work": re.compile(r"\((first|second|third|fourth|fifth) round\)", re.I),
    "the development machine": re.compile(r"development machine|lent device|device tool", re.I),
}


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_check_reads_the_pages() -> None:
    names = {_name(p) for p in PAGES}
    assert {"docs/faults.md", "docs/gpu.md", "docs/dev/architecture.md", "README.md"} <= names
    assert HISTORY["a note of what was before"].search("a traceback (was: exit 1)")
    assert HISTORY["an issue number"].search("before issue 14 it was")


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_a_page_carries_no_history(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    found = [
        f"line {text.count(chr(10), 0, m.start()) + 1}: {what}: {m.group(0)!r}"
        for what, pattern in HISTORY.items()
        for m in pattern.finditer(text)
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_section_titles_are_unique_on_a_page(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    titles = re.findall(r"^#{1,6} (.+)$", text, flags=re.M)
    assert len(titles) == len(set(titles)), sorted(t for t in titles if titles.count(t) > 1)
