"""`syncscope fix` on long files: only what a fix can touch or read goes through
libcst (syncscope/fixes/focus.py); the rest is elided and put back byte for byte.

Times are printed by benchmarks/bench_fix.py, not asserted here: these tests hold what the
elision must keep (the same fix, the same problem lines, every other byte) and that it
does elide (the text libcst parses stays small).
"""

from __future__ import annotations

import ast
import io
from pathlib import Path

import libcst as cst
import pytest

from syncscope.errors import SyncscopeError
from syncscope.fixes import codemod, focus
from syncscope.fixes.codemod import FixOptions, RunHints, fix_source
from tests.helpers.fixed import fixed

FIXTURES = Path(__file__).parent.parent / "fixtures" / "fix"

# every odd byte a file may hold outside a loop: a tab-indented function, a form feed (a
# line of its own and before a statement), U+2028 in a string (not a line end for Python,
# one for str.splitlines), CRLF and a lone CR line end, a statement over two lines
PADDING = (
    "".join(f"value_{i} = torch.zeros({i % 7 + 1}) * {i}  # padding\n" for i in range(290))
    + "def helper(x):\n\ty = x + 1\n\treturn y\n"
    + "\x0c\n\x0cafter_form_feed = 1\n"
    + "note = 'a line separator \u2028 here'\r\n"
    + "crlf = 2\r\n"
    + "spread = (1,\n    2)\n"
    + "lone_cr = 3\r"
)


PLAIN = "".join(f"value_{i} = torch.zeros({i % 7 + 1}) * {i}\n" for i in range(300))


def _split(text: str) -> list[str]:
    """Lines as Python numbers them (not str.splitlines: form feeds, U+2028), ends kept."""
    return io.StringIO(text, newline="").readlines()


def _python_lines(text: str) -> int:
    return len(_split(text))


def _parsed_lines(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records the length, in lines, of every text libcst parses as a module."""
    seen: list[int] = []
    parse_module = cst.parse_module

    def counting(source: str, *args: object, **kwargs: object) -> cst.Module:
        seen.append(source.count("\n") + 1)
        return parse_module(source, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(cst, "parse_module", counting)
    return seen


def _first_line(node: ast.stmt) -> int:
    """Where a statement starts: a decorated function's first decorator."""
    return min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])


def _pad(text: str, padding: str = PADDING) -> tuple[str, int]:
    """``text`` with ``padding`` after its docstring and imports (where a fix adds its own)
    and at its end; and the line ``padding`` went before."""
    body = ast.parse(text).body
    first = next(
        _first_line(node)
        for node in body
        if not isinstance(node, (ast.Import, ast.ImportFrom))
        and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
    )
    lines = _split(text)
    return "".join(lines[: first - 1]) + padding + "".join(lines[first - 1 :]) + padding, first


# one fixture of each family in the quick loop; the whole sweep (~0.5 s a fixture) in .ci/run
QUICK_FIXTURES = {
    "accelerate_hand_gate_class",
    "ddp_no_sync_backward_only",
    "ddp_no_sync_correct",
    "fsdp2_never_enabled",
    "helper_sync_flag_class",
    "ifelse_forward_in_branches_scaler",
    "nested_steps_micro_class",
    "while_counter_continue_scaler",
}


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(
            path,
            id=path.name.removesuffix(".in.py"),
            marks=() if path.name.removesuffix(".in.py") in QUICK_FIXTURES else (pytest.mark.slow,),
        )
        for path in sorted(FIXTURES.glob("*.in.py"))
    ],
)
def test_a_long_file_is_fixed_exactly_as_its_short_self(source: Path) -> None:
    """GIVEN every fixture with 300 odd statements after its imports and at its end WHEN
    fixed THEN the same rewrite, the padding intact byte for byte, the problem lines
    shifted by it."""
    short = source.read_text()
    padded, first = _pad(short)
    assert focus.focus(padded).elided  # it does elide
    expected = fixed(short)
    result = fix_source(padded)
    assert result.fixed == _pad(expected.fixed)[0]
    shift = _python_lines(PADDING)
    shifted = [
        (p.code, p.line + (shift if p.line >= first else 0), p.fixed, p.suggestion)
        for p in expected.problems
    ]
    assert [(p.code, p.line, p.fixed, p.suggestion) for p in result.problems] == shifted
    assert result.notes == expected.notes


def _interleaved(source: str) -> str:
    """``source`` with padding statements before each of its top-level statements but the
    first, enough of them for the file to be elided."""
    lines = source.splitlines(keepends=True)
    starts = [_first_line(node) for node in ast.parse(source).body[1:]]
    every = focus.MIN_STATEMENTS // len(starts) + 1
    pad = "".join(f"pad_{{}}_{i} = torch.zeros({i}) + {i}\n" for i in range(every))
    out: list[str] = []
    for number, line in enumerate(lines, start=1):
        if number in starts:
            out.append(pad.replace("{}", str(number)))
        out.append(line)
    return "".join(out)


@pytest.mark.slow  # every fixture, ~3 s each: the whole sweep runs in .ci/run
@pytest.mark.parametrize(
    "name", sorted(p.name.removesuffix(".in.py") for p in FIXTURES.glob("*.in.py"))
)
def test_eliding_changes_nothing_of_the_fix(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN padding between every two top-level statements (the guard, the counter, the
    Accelerator, the model each far from the loop) WHEN fixed with elision and with the whole
    file through libcst THEN the same text and the same problems."""
    source = _interleaved((FIXTURES / f"{name}.in.py").read_text())
    assert focus.focus(source).elided
    elided = fix_source(source)
    monkeypatch.setattr(focus, "MIN_STATEMENTS", 10**9)
    whole = fix_source(source)
    assert elided.fixed == whole.fixed
    assert elided.problems == whole.problems


def test_an_import_the_fix_adds_goes_after_a_docstring_that_names_nothing() -> None:
    """GIVEN a module docstring with no word of the sync machinery, padding, then a loop the
    fix gives ``import contextlib`` WHEN fixed THEN the import goes after the docstring, as
    in the fix of the whole file."""
    body = (FIXTURES / "ddp_no_sync_backward_only.in.py").read_text().split("\n", 1)[1]
    source = '"""Trains a model."""\n' + PADDING.replace("\r\n", "\n").replace("\r", "\n") + body
    result = fix_source(source)
    assert result.fixed.startswith('"""Trains a model."""\nimport contextlib\n')
    assert result.fixed.count(PADDING.replace("\r\n", "\n").replace("\r", "\n")) == 1


def test_a_run_hint_names_lines_of_the_whole_file() -> None:
    """GIVEN two loops far apart in a long file and a profile (``--from``) pointing at the
    second, by its line in the whole file WHEN fixed THEN that loop only is rewritten."""
    loop = (
        "\ndef train_{k}(model, optimizer, batches):\n"
        "    for i, batch in enumerate(batches):\n"
        "        loss = model(batch).sum()\n"
        "        loss.backward()\n"
        "        if (i + 1) % 4 == 0:\n"
        "            optimizer.step()\n"
        "            optimizer.zero_grad()\n"
    )
    head = "import torch\n"
    source = head + PADDING + loop.format(k=1) + PADDING + loop.format(k=2) + PADDING
    second = _python_lines(head + PADDING + loop.format(k=1) + PADDING) + 4  # its backward
    assert _split(source)[second - 1] == "        loss.backward()\n"
    hints = RunHints(wrapper="ddp", ddp_form="no_sync", lines=frozenset({second}))
    result = fix_source(source, FixOptions(hints=hints))
    assert [(p.code, p.fixed) for p in result.problems] == [("SYN101", True)]
    alone = fix_source(head + loop.format(k=2), FixOptions(style="no_sync"))
    [problem] = alone.problems
    shown = _split(head + loop.format(k=2))[problem.line - 1]
    assert _split(source)[result.problems[0].line - 1] == shown
    assert result.problems[0].line > second - 4
    before, after = result.fixed.split("def train_2")
    assert loop.format(k=1) in before and "no_sync" in after
    assert after.endswith(PADDING)


def test_a_long_file_goes_through_libcst_as_a_short_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN 60,000 plain lines (more than libcst is given, MAX_LINES) around a loop WHEN
    fixed THEN it is fixed, not refused, and no text libcst parses is longer than the loop
    and what it reads."""
    short = (FIXTURES / "ddp_no_suppression_modulo.in.py").read_text()
    padding = "".join(f"value_{i} = torch.zeros(3) * {i}\n" for i in range(30_000))
    parsed = _parsed_lines(monkeypatch)
    result = fix_source(padding + short + padding)
    assert parsed and max(parsed) < 2 * short.count("\n") + 10, parsed
    assert result.changed and all(p.fixed for p in result.problems)
    assert result.fixed.count("value_") == 60_000


@pytest.mark.slow  # seconds of CPU: in the slow loop (.ci/run)
def test_a_placeholder_lost_by_a_rewrite_falls_back_to_the_whole_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GIVEN a rewrite that (hypothetically) loses a placeholder of the elided text WHEN
    fixed THEN the whole file goes through libcst instead: nothing elided is lost."""
    short = (FIXTURES / "ddp_no_sync_backward_only.in.py").read_text()
    padded = PLAIN + short + PLAIN  # the whole file through libcst keeps only plain padding
    expected = fix_source(padded)
    restore = focus.Focus.restore
    calls: list[int] = []

    def losing(self: focus.Focus, text: str) -> str | None:
        calls.append(len(self.elided))
        first = next(iter(self.elided), None)
        return restore(self, text.replace(first, "pass", 1) if first else text)

    monkeypatch.setattr(focus.Focus, "restore", losing)
    assert fix_source(padded).fixed == expected.fixed
    assert calls[0] > 0 and calls[-1] == 0  # elided, lost, then the whole file


def test_restore_refuses_a_missing_or_doubled_placeholder() -> None:
    source = PADDING + "import torch\n" + PADDING
    focused = focus.focus(source)
    assert focused.restore(focused.text) == source
    first = next(iter(focused.elided))
    assert focused.restore(focused.text.replace(first, "pass")) is None
    assert focused.restore(focused.text + first + "\n") is None


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        ("MAX_LINES", r"lines where a fix can touch or read, more than syncscope fix reads \(20\)"),
        ("MAX_FILE_LINES", r"^huge.py: \d\d\d lines, more than syncscope fix reads \(20\)"),
    ],
)
def test_beyond_the_bounds_is_refused_in_one_line(
    limit: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The text through libcst (MAX_LINES, ~80 KB a line) and the whole file through
    Python's parser (MAX_FILE_LINES) are bounded: beyond, one line naming the bound."""
    monkeypatch.setattr(codemod, limit, 20)
    source = (FIXTURES / "nanogpt_ddp_optional.in.py").read_text() + PADDING + PADDING
    with pytest.raises(SyncscopeError, match=expected) as caught:
        fix_source(source, path="huge.py")
    assert "\n" not in str(caught.value)


def test_apply_keeps_every_byte_of_a_long_crlf_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """GIVEN a long script written with CRLF line ends, tabs and form feeds WHEN ``fix
    --apply`` THEN the file is the short fix with the same padding, byte for byte, and
    SCRIPT.bak the original bytes."""
    from syncscope import cli

    short = (FIXTURES / "ddp_no_sync_backward_only.in.py").read_text().replace("\n", "\r\n")
    data = _pad(short)[0].encode()
    script = tmp_path / "long.py"
    script.write_bytes(data)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["fix", "--apply", "long.py"]) == 0
    err = capsys.readouterr().err
    assert "(fixed)" in err and "wrote" in err
    fixed = fix_source(short).fixed
    assert "\r\n" in fixed and "\n" not in fixed.replace("\r\n", "")  # CRLF kept in the fix
    assert script.read_bytes() == _pad(fixed)[0].encode()
    assert (tmp_path / "long.py.bak").read_bytes() == data


# --- Python's parse a group of statements at a time (syncscope/fixes/chunks.py) -------------

TRICKY = (
    'doc = """\nword at column 0 inside a string\nelse_like = 1\n"""\n'
    "numbers = [\n1,\nvalue_0,\n]\n"
    "total = 1 + \\\n    2\n"
    "@staticmethod\n@property\ndef decorated():\n    return 1\n"
    "try:\n    pass\nexcept ValueError:\n    pass\nfinally:\n    pass\n"
    "if total:\n    pass\nelif numbers:\n    pass\nelse:\n    pass\n"
    "a = 1; b = 2\n"
    "class Spread:\n    x = 1\n\n\n    y = 2\n"
)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
def test_groups_cut_only_between_statements(size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN strings, brackets, backslashes, decorators, else/except/finally clauses and
    statements sharing a line, WHEN parsed a group of ``size`` lines at a time THEN the same
    elision as in one piece: every statement whole, at its line."""
    from syncscope.fixes import chunks

    short = (FIXTURES / "ddp_no_suppression_modulo.in.py").read_text()
    source = _pad(short, TRICKY * 30)[0]
    whole = focus.focus(source)
    monkeypatch.setattr(chunks, "CHUNK_LINES", size)
    assert focus.focus(source) == whole and whole.elided
    assert fix_source(source).fixed == _pad(fix_source(short).fixed, TRICKY * 30)[0]


@pytest.mark.parametrize(
    "broken",
    [
        "x = (1,\n",  # never closed, at the end: the group reaches the end first
        "def f(:\n    pass\n",  # a plain syntax error
        "x = 1\n  y = 2\n",  # unexpected indent
        'x = """never closed\n',
        "return 1\n",  # only the compiler refuses it
        "from __future__ import annotations\n",  # too late in the file
    ],
)
def test_a_syntax_error_in_a_long_file_is_reported_where_python_does(
    broken: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GIVEN a long file broken after 3,000 lines of statements, parsed 40 lines at a time
    WHEN fixed THEN refused in one line at the line Python names."""
    from syncscope.fixes import chunks

    monkeypatch.setattr(chunks, "CHUNK_LINES", 40)
    source = "import torch\n" + PLAIN * 10 + broken + PLAIN
    try:
        compile(source, "long.py", "exec", dont_inherit=True)
    except SyntaxError as exc:
        line = exc.lineno
    with pytest.raises(SyncscopeError, match=rf"^long.py: syntax error at line {line}, ") as e:
        fix_source(source, path="long.py")
    assert "\n" not in str(e.value)


def test_a_script_beyond_the_size_bound_is_not_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The script is read up to MAX_SCRIPT_BYTES (64 MiB), no further: beyond, one line,
    exit 2, the file untouched."""
    from syncscope import cli
    from syncscope.fixes import driver

    monkeypatch.setattr(driver, "MAX_SCRIPT_BYTES", 1 << 20)
    script = tmp_path / "big.py"
    script.write_text(PLAIN * 250)  # about 2.6 MB
    monkeypatch.chdir(tmp_path)
    assert cli.main(["fix", "--apply", "big.py"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "big.py: more than 1 MiB, more than syncscope fix reads" in err
    assert script.read_text() == PLAIN * 250


@pytest.mark.parametrize("padded", [False, True], ids=["short", "long"])
def test_a_form_feed_libcst_would_drop_is_never_lost(padded: bool) -> None:
    """libcst drops a form feed that opens a statement's line when it renders the module
    (elided statements never reach it). GIVEN one where the fix reads WHEN fixed THEN the
    problem is reported and nothing rewritten, naming the line; GIVEN one in a file with
    nothing to fix THEN the file is unchanged (no diff that deletes it)."""
    short = (FIXTURES / "ddp_no_sync_backward_only.in.py").read_text()
    source = short.replace("accum = 4\n", "\x0caccum = 4\n")  # the loop reads it: kept
    if padded:
        source = _pad(source)[0]
    line = _split(source).index("\x0caccum = 4\n") + 1
    result = fix_source(source)
    assert not result.changed and result.fixed == source
    [problem] = result.problems
    assert not problem.fixed
    assert f"would not keep line {line} byte for byte" in problem.suggestion
    clean = (FIXTURES / "ddp_no_sync_correct.in.py").read_text() + "\x0cafter = 1\n"
    assert fix_source(clean).fixed == clean and not fix_source(clean).problems


# --- one huge function: elided inside, not only at the top level --------------------------


def _body_padding(indent: str, count: int, tag: str) -> str:
    """``count`` statements at ``indent`` no fix reads, and some odd ones: a nested helper,
    a string with lines at column 0, a statement over two lines, two sharing a line, an
    ``if``/``else``, a comment."""
    plain = [f"{indent}{tag}_{i} = torch.zeros({i % 7 + 1}) * {i}\n" for i in range(count)]
    odd = (
        f"{indent}def helper_{tag}(x):\n{indent}    return x + 1\n"
        f"{indent}doc_{tag} = '''\ncolumn 0 inside a string\n'''\n"
        f"{indent}spread_{tag} = (1,\n2)\n"
        f"{indent}a_{tag} = 1; b_{tag} = 2\n"
        f"{indent}# a comment\n"
        f"{indent}if a_{tag}:\n{indent}    c_{tag} = 1\n{indent}else:\n{indent}    c_{tag} = 2\n"
    )
    return "".join(plain[: count // 2]) + odd + "".join(plain[count // 2 :])


def _in_function(source: str, count: int) -> str:
    """``source`` with ``count`` statements (and the odd ones) before and after its training
    loop (a ``for``/``while`` calling ``backward``), at the loop's indentation: inside the
    function that holds it; a loop at the top level goes, with them, under ``if __name__ ==
    "__main__":`` (a block elided inside in the same way)."""
    loops = [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.For, ast.While))]

    def calls(node: ast.AST, attr: str) -> bool:
        return any(isinstance(c, ast.Attribute) and c.attr == attr for c in ast.walk(node))

    # the loop that runs the backward, or that steps (its backward in a helper it calls)
    loop = next((n for n in loops if calls(n, "backward")), None)
    loop = loop or next(n for n in loops if calls(n, "step"))
    lines = _split(source)
    end = loop.end_lineno or loop.lineno
    body = lines[loop.lineno - 1 : end]
    head = ""
    if loop.col_offset == 0:
        head = 'if __name__ == "__main__":\n'
        body = ["    " + line if line.strip() else line for line in body]
    indent = " " * (loop.col_offset or 4)
    return (
        "".join(lines[: loop.lineno - 1])
        + head
        + _body_padding(indent, count, "before")
        + "".join(body)
        + _body_padding(indent, count, "after")
        + "".join(lines[end:])
    )


def test_a_huge_function_goes_through_libcst_as_a_short_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GIVEN a script that is one function of 6,000 statements around its loop WHEN fixed
    THEN libcst is given the loop and what it reads, not the function (before: the whole
    function, 96 s for 10,000 lines), and the fix is the short script's, every padding byte
    back in place."""
    short = (FIXTURES / "ddp_no_suppression_modulo.in.py").read_text()
    source = _in_function(short, 3_000)
    parsed = _parsed_lines(monkeypatch)
    result = fix_source(source)
    assert parsed and max(parsed) < short.count("\n") + 20, parsed
    anchor = "    for i, (x, y) in enumerate(loader):\n"
    expected = fix_source(short).fixed.replace(
        anchor, _body_padding("    ", 3_000, "before") + anchor
    )
    assert result.fixed == expected + _body_padding("    ", 3_000, "after")
    assert [(p.code, p.fixed) for p in result.problems] == [("SYN101", True)]
    line = _split(source).index("        loss.backward()  # gradients accumulate in .grad\n") + 1
    assert result.problems[0].line < line  # lines of the whole file, past the padding


def _fix_in_function(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    source = _in_function((FIXTURES / f"{name}.in.py").read_text(), 250)
    assert focus.focus(source).elided
    elided = fix_source(source)
    monkeypatch.setattr(focus, "MIN_STATEMENTS", 10**9)
    whole = fix_source(source)
    assert elided.fixed == whole.fixed
    assert elided.problems == whole.problems


@pytest.mark.slow  # seconds of CPU: in the slow loop (.ci/run)
def test_eliding_inside_a_function_changes_nothing_of_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GIVEN padding inside the function of the loop WHEN fixed with elision and with the
    whole file through libcst THEN the same text and problems (all fixtures: the slow test
    below)."""
    _fix_in_function("ddp_no_suppression_modulo", monkeypatch)


@pytest.mark.slow  # every fixture, ~5 s each: the whole sweep runs in .ci/run
@pytest.mark.parametrize(
    "name", sorted(p.name.removesuffix(".in.py") for p in FIXTURES.glob("*.in.py"))
)
def test_eliding_inside_every_fixture_changes_nothing(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fix_in_function(name, monkeypatch)


@pytest.mark.slow  # a syncscope fix process
def test_fix_of_a_30000_line_function_ends_in_seconds(tmp_path: Path) -> None:
    """GIVEN a script that is one 30,000-line function WHEN ``syncscope fix`` THEN its
    report within 90 s on a loaded machine (about 3 s; before: 248 s and 761 MB)."""
    import subprocess
    import sys

    short = (FIXTURES / "ddp_no_suppression_modulo.in.py").read_text()
    script = tmp_path / "huge.py"
    script.write_text(_in_function(short, 15_000))
    done = subprocess.run(
        [sys.executable, "-m", "syncscope", "fix", str(script)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 1, done.stderr
    assert "SYN101" in done.stderr + done.stdout and "+import contextlib" in done.stdout
