"""Python's own check and parse of a long source, a group of top-level statements at a time.

``compile()`` of a whole 100,000-line file of dense lines peaked at 4 GB, ``ast.parse`` at
5 GB: the memory follows the file. Parsed a few thousand lines (or 256 K characters) at a
time, each group cut where a top-level statement starts, the peak follows the group, and
the caller keeps only what it needs of each statement.

A cut is tried at a line that starts, in column 0, a word other than ``else``, ``elif``,
``except`` or ``finally``. Such a line starts a top-level statement unless it lies inside
an open bracket, a triple-quoted string or after a backslash; then the text before it
does not compile (unclosed bracket, unterminated string, unexpected end), and the group is
tried twice as long. A syntax error met again, at the same line, in the longer group (or
with the rest of the file in it) is the file's own, reported at its line in the whole
file.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

CHUNK_LINES = 4_000  # a group: this many lines ...
CHUNK_CHARS = 256 << 10  # ... or this many characters, whichever comes first
_CUT = re.compile(r"[^\W\d]\w*")  # a word in column 0 (an identifier or a keyword)
_CONTINUES = frozenset({"else", "elif", "except", "finally"})
_OPEN = ("never closed", "unterminated triple-quoted", "unexpected EOF")


def _cut(lines: list[str], index: int) -> int:
    """The first line at or after ``index`` where a top-level statement may start."""
    for at in range(max(index, 1), len(lines)):
        word = _CUT.match(lines[at])
        decorated = lines[at - 1].startswith("@")  # the def of a decorator: not a start
        if word is not None and word.group() not in _CONTINUES and not decorated:
            return at
    return len(lines)


def groups(lines: list[str], path: str) -> Iterator[tuple[int, list[ast.stmt]]]:
    """(lines before the group, its top-level statements) for consecutive groups of
    ``lines`` (a source split as Python numbers its lines), each compiled and parsed on
    its own; raises what ``compile`` raises, line numbers those of the whole source."""
    start = 0
    while start < len(lines):
        size = _size(lines, start)
        seen: tuple[int | None, str] | None = None
        while True:
            end = _cut(lines, start + size)
            try:
                body = _parse("".join(lines[start:end]), path)
                break
            except SyntaxError as exc:
                # a cut inside a statement fails there; once longer, elsewhere or not at all
                # (an open bracket or string may reach past the longer cut too)
                if end < len(lines) and (seen != (exc.lineno, exc.msg) or _open(exc.msg)):
                    seen = (exc.lineno, exc.msg)
                    size *= 2
                    continue
                if exc.lineno is not None:
                    exc.lineno += start
                raise
        if start and any(_is_future(node) for node in body):
            raise SyntaxError(
                "from __future__ imports must occur at the beginning of the file",
                (path, start + next(n.lineno for n in body if _is_future(n)), 1, "", None, None),
            )
        yield start, body
        start = end


def _size(lines: list[str], start: int) -> int:
    """Lines from ``start`` making a group of CHUNK_LINES or CHUNK_CHARS (at least one)."""
    chars = 0
    for count, line in enumerate(lines[start : start + CHUNK_LINES], start=1):
        chars += len(line)
        if chars >= CHUNK_CHARS:
            return count
    return CHUNK_LINES


def _open(message: str) -> bool:
    """Whether a syntax error says the text ended inside a statement."""
    return any(words in message for words in _OPEN)


def _parse(text: str, path: str) -> list[ast.stmt]:
    tree = ast.parse(text, path)
    compile(tree, path, "exec", dont_inherit=True)  # what only the compiler refuses
    return tree.body


def _is_future(node: ast.stmt) -> bool:
    return isinstance(node, ast.ImportFrom) and node.module == "__future__"
