"""Only the part of a long file that can matter goes through libcst.

libcst costs tens of microseconds and hundreds of bytes per node, several times per pass
(parse, scopes, parents, positions, rendering): a 20,000-line file took 28 s, 200,000 lines
more than 300 s and 2.7 GB. Most of such a file cannot take part in a fix, so Python's own
parser (``ast``, in C) picks the top-level statements that can, and the others are elided:
each run of them becomes one placeholder line for the analysis and the rewrite, and gets its
text back, byte for byte, afterwards.

A top-level statement is kept when it holds a ``for``/``while`` loop calling ``backward``,
imports, mentions a word of the sync machinery (wrappers, toggles, ``Accelerator``, the
names a fix may add), or binds a name that a kept statement reads (to a fixed point: the
model, the optimizer, ``accum``, the ``ddp`` condition, a helper the loop calls). What is
elided is code a fix neither reads nor writes. The body of a kept function (class, ``if``,
``with``, ``try``) of many statements is chosen from by the same rule, its runs elided as
placeholders at its indentation: a script that is one 30,000-line function took 248 s and
761 MB through libcst whole.
"""

from __future__ import annotations

import ast
import bisect
import io
import re
from dataclasses import dataclass

from syncscope.fixes.chunks import groups

_WORDS = re.compile(
    r"DistributedDataParallel|DDP|FSDP|FullyShard|fully_shard|Accelerator|accelerate|prepare"
    r"|no_sync|require_backward_grad_sync|set_requires_gradient_sync|sync_gradients"
    r"|torch\.compile|distributed|is_last|syncscope|contextlib|nullcontext|zero_grad|step\b",
)
MIN_STATEMENTS = 200  # fewer top-level statements: nothing worth eliding


@dataclass(frozen=True)
class Focus:
    """The text the fix works on, and how to get the whole file back."""

    text: str
    elided: dict[str, str]  # placeholder line -> the original lines it stands for
    starts: tuple[int, ...] = ()  # line of each placeholder in ``text``, ascending
    extra: tuple[int, ...] = ()  # lines elided up to and including each placeholder

    def original_line(self, line: int) -> int:
        """The line of ``self.text`` numbered as in the whole file."""
        before = bisect.bisect_left(self.starts, line)
        return line + (self.extra[before - 1] if before else 0)

    def restore(self, text: str) -> str | None:
        """``text`` (``self.text``, fixed) with every elided run put back; None unless
        every placeholder is found, once and unchanged (the caller then fixes the whole
        file)."""
        if not self.elided:
            return text
        out: list[str] = []
        found = 0
        for line in python_lines(text):
            original = self.elided.get(line.rstrip("\r\n"))
            if original is None:
                out.append(line)
            else:
                out.append(original)
                found += 1
        return "".join(out) if found == len(self.elided) else None


@dataclass(frozen=True, slots=True)
class _Statement:
    """What the choice needs of one top-level statement (or of several sharing a line)."""

    first: int  # first line, decorators included (1-based)
    last: int
    seed: bool  # kept whatever it binds
    binds: frozenset[str]


def focus(source: str, path: str = "<script>") -> Focus:
    """The parts of ``source`` a fix can touch or read; all of it when that is all.

    Compiles ``source`` on the way, a few thousand lines at a time (``chunks``): raises
    what ``compile`` raises. The body of a kept function, class, ``if``, ``with`` or
    ``try`` of at least MIN_STATEMENTS statements is chosen from the same way, one level
    at a time (``_inner_runs``): a script that is one huge function is elided inside it.
    """
    lines = python_lines(source)
    statements = _scan(lines, path)
    whole = len(statements) < MIN_STATEMENTS
    keep = set(range(len(statements))) if whole else _kept(statements, lines)
    runs = [] if whole else _runs(statements, keep)
    for index in sorted(keep):
        runs.extend(_inner_runs(statements[index], lines))
    return _elide(source, lines, sorted(runs))


def _scan(lines: list[str], path: str) -> list[_Statement]:
    """The top-level statements' summaries (the syntax trees are freed on return)."""
    statements: list[_Statement] = []
    for offset, body in groups(lines, path):
        for node in body:
            statements.append(_summary(node, offset, lines, not statements))
    return _merged(statements)


_BLOCKS = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.If,
    ast.With,
    ast.AsyncWith,
    ast.Try,
)  # a loop's own body is never elided: the fix rewrites it


def _inner_runs(block: _Statement, lines: list[str]) -> list[tuple[int, int]]:
    """The runs to elide in the body of ``block`` (kept whole at its own level), and, to
    any depth, in the bodies of the statements kept there (of every statement, where the
    body is too short to elide in: a class of a few long methods)."""
    if block.last - block.first + 1 < MIN_STATEMENTS:
        return []  # too short to hold MIN_STATEMENTS statements of its own
    text = "".join(lines[block.first - 1 : block.last])
    indented = text[:1] in (" ", "\t")
    try:
        tree = ast.parse("if 1:\n" + text if indented else text)
    except SyntaxError:  # compiled as part of the file; not on its own: not elided
        return []
    nodes = tree.body[0].body if indented and isinstance(tree.body[0], ast.If) else tree.body
    if len(nodes) != 1 or not isinstance(nodes[0], _BLOCKS):
        return []
    node = nodes[0]
    offset = block.first - 1 - (1 if indented else 0)
    if node.body[0].lineno == node.lineno:
        return []
    statements = _merged([_summary(sub, offset, lines, False) for sub in node.body])
    column = node.body[0].col_offset
    few = len(node.body) < MIN_STATEMENTS  # a class of a few long methods: into each of them
    del tree, nodes, node
    keep = set(range(len(statements))) if few else _kept(statements, lines)
    # a run is elided where its first line holds only blanks and tabs before it (not a form
    # feed): its placeholder, indented the same, then stands where it stood
    runs = [
        (first, last)
        for first, last in _runs(statements, keep)
        if len(lines[first - 1]) - len(lines[first - 1].lstrip(" \t")) == column
    ]
    for index in sorted(keep):
        runs.extend(_inner_runs(statements[index], lines))
    return runs


def _runs(statements: list[_Statement], keep: set[int]) -> list[tuple[int, int]]:
    """(first, last) line of each run of consecutive statements not kept."""
    runs: list[tuple[int, int]] = []
    open_run = False
    for index, st in enumerate(statements):
        if index in keep:
            open_run = False
        elif open_run:
            runs[-1] = (runs[-1][0], st.last)
        else:
            runs.append((st.first, st.last))
            open_run = True
    return runs


def _summary(node: ast.stmt, offset: int, lines: list[str], first: bool) -> _Statement:
    start = node.lineno
    for decorator in getattr(node, "decorator_list", ()):
        start = min(start, decorator.lineno)
    end = node.end_lineno or node.lineno
    text = "".join(lines[offset + start - 1 : offset + end])
    seed = _is_seed(node, text) or (first and _is_docstring(node))  # imports go after it
    return _Statement(offset + start, offset + end, seed, frozenset(_binds(node, text)))


def _merged(statements: list[_Statement]) -> list[_Statement]:
    """One entry per run of statements sharing lines (``a = 1; b = 2``): elided whole."""
    out: list[_Statement] = []
    for st in statements:
        if out and st.first <= out[-1].last:
            last = out[-1]
            out[-1] = _Statement(
                last.first, max(last.last, st.last), last.seed or st.seed, last.binds | st.binds
            )
        else:
            out.append(st)
    return out


def _is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def python_lines(text: str) -> list[str]:
    """Lines as Python numbers them (``\n``, ``\r\n``, ``\r``; ``str.splitlines`` also
    splits at form feeds and U+2028, which a source may hold), ends kept."""
    return io.StringIO(text, newline="").readlines()


def _names(nodes: list[ast.AST], stored: bool) -> set[str]:
    """Names the ``nodes`` bind (``stored``) or read, nested scopes included."""
    found: set[str] = set()
    for node in nodes:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                if isinstance(sub.ctx, (ast.Store, ast.Del)) == stored:
                    found.add(sub.id)
            elif not stored:
                continue
            elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.add(sub.name)
            elif isinstance(sub, ast.alias):
                found.add((sub.asname or sub.name).split(".")[0])
            elif isinstance(sub, (ast.Global, ast.Nonlocal)):
                found.update(sub.names)
    return found


def _binds(node: ast.stmt, text: str) -> set[str]:
    """Module-level names ``node`` may bind: its targets only, for the common plain
    statements (their values are not walked), all it stores for the rest."""
    if ":=" in text or "global" in text:
        return _names([node], stored=True)
    if isinstance(node, ast.Assign):
        return _names(list(node.targets), stored=True)
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return _names([node.target], stored=True)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Expr, ast.Pass)):
        return set()
    return _names([node], stored=True)


def _is_seed(node: ast.stmt, text: str) -> bool:
    if isinstance(node, (ast.Import, ast.ImportFrom)) or _WORDS.search(text):
        return True
    if "backward" not in text:
        return False
    return any(
        isinstance(sub, (ast.For, ast.AsyncFor, ast.While))
        and any(
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "backward"
            for call in ast.walk(sub)
        )
        for sub in ast.walk(node)
    )


def _kept(statements: list[_Statement], lines: list[str]) -> set[int]:
    """Indices of the statements to keep: the seeds and, to a fixed point, every statement
    binding a name a kept statement reads or binds (read from its own text, parsed again:
    the kept statements are few)."""
    binders: dict[str, list[int]] = {}
    for index, st in enumerate(statements):
        for name in st.binds:
            binders.setdefault(name, []).append(index)
    keep: set[int] = set()
    todo = [i for i, st in enumerate(statements) if st.seed]
    wanted: set[str] = set()
    while todo:
        index = todo.pop()
        if index in keep:
            continue
        keep.add(index)
        st = statements[index]
        text = "".join(lines[st.first - 1 : st.last])
        tree = ast.parse("if 1:\n" + text if text[:1] in (" ", "\t") else text)
        for name in (_names(list(tree.body), stored=False) | st.binds) - wanted:
            wanted.add(name)
            todo.extend(binders.get(name, ()))
    return keep


def _elide(source: str, lines: list[str], runs: list[tuple[int, int]]) -> Focus:
    """``source`` with each run of lines (ascending, apart) one placeholder line, indented
    as the run's first line."""
    if not runs:
        return Focus(source, {})
    nonce = 0
    while f"syncscope-elided-{nonce}-" in source:
        nonce += 1
    # placeholders end as the file's first line does: libcst takes the file's newline from
    # it, and refuses a lone CR in a file of LF lines
    first_end = re.search(r"\r\n?|\n", source)
    newline = first_end.group() if first_end else "\n"
    out: list[str] = []
    elided: dict[str, str] = {}
    starts: list[int] = []
    extra: list[int] = []
    cursor = 0  # lines of ``lines`` consumed
    for first, last in runs:
        out.extend(lines[cursor : first - 1])
        line = lines[first - 1]
        indent = line[: len(line) - len(line.lstrip(" \t"))]
        placeholder = f"{indent}pass  # syncscope-elided-{nonce}-{len(elided)}"
        elided[placeholder] = "".join(lines[first - 1 : last])
        out.append(placeholder + newline)
        starts.append(len(out))
        extra.append((extra[-1] if extra else 0) + (last - first))
        cursor = last
    out.extend(lines[cursor:])
    return Focus("".join(out), elided, tuple(starts), tuple(extra))
