"""``syncscope fix``'s pipeline: check a script's accumulation loops, then show, verify or
write the rewrite.

Dry run by default: a unified diff on stdout and one line per problem on stderr. With
``verify`` the original and the fixed script are profiled side by side first; with ``apply``
the script is rewritten in place (atomically, through a symlink, keeping ``SCRIPT.bak``).
Exit status: 0 nothing to fix, 1 problems found (dry run) or left unfixed (``apply``).
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from syncscope.errors import SyncscopeError

MAX_SCRIPT_BYTES = 64 << 20  # a script read whole; fix_source bounds its lines too

if TYPE_CHECKING:  # libcst is imported only when a fix runs
    from syncscope.fixes.codemod import FixResult
    from syncscope.fixes.styles import Style


def fix(
    script: Path,
    args: Sequence[str] = (),
    apply: bool = False,
    style: Style = "auto",
    from_run: Path | None = None,
    verify: bool = False,
    nproc_per_node: int = 2,
    backup: bool = True,
    allow_outside: bool = False,
) -> int:
    """Propose (dry run), ``verify`` or ``apply`` fixes to the accumulation loops of
    ``script`` (``args``: its arguments, for ``verify``); returns the exit status."""
    from syncscope.fixes.codemod import FixOptions, fix_source

    data = _read(script)
    source, encoding = _decode(script, data)
    hints = None
    if from_run is not None:
        from syncscope.fixes.run_hints import load_hints

        hints = load_hints(from_run, script, data)
    unaddressed: list[str] = []
    if hints is not None:
        from syncscope.fixes.run_edits import fix_with_run, unaddressed_lines

        result = fix_with_run(source, FixOptions(style, hints), str(script))
        unaddressed = unaddressed_lines(result, hints.findings)
    else:
        result = fix_source(source, FixOptions(style, hints), path=str(script))
    if result.changed and not apply:
        diff = result.diff(str(script))
        sys.stdout.write(diff if diff.endswith("\n") else diff + "\n")
    if apply and result.changed:
        _check_inside(script, allow_outside)
        _check_writable(script)
    if verify and result.changed:
        _check_inside(script, allow_outside)
        _verify(script, result, nproc_per_node, args, encoding)
    if apply and result.changed:
        _check_unchanged(script, data)
        _write(script, result.fixed.encode(encoding), backup)
    _print_problems(result, str(script), written=apply)  # "(fixed)" once the file is written
    if apply and result.changed:
        print(f"syncscope: wrote {script}", file=sys.stderr)
    for line in unaddressed:  # the run's problems that are no loop rewrite: never a silent 0
        print(f"{script}:{line}", file=sys.stderr)
    unfixed = any(not p.fixed for p in result.problems)
    return 1 if (result.problems and (not apply or unfixed)) or unaddressed else 0


def _read(script: Path) -> bytes:
    _check_regular(script)
    try:
        with script.open("rb") as stream:
            data = stream.read(MAX_SCRIPT_BYTES + 1)
    except OSError as exc:
        raise SyncscopeError(f"{script}: cannot read it ({exc.strerror})") from None
    if len(data) > MAX_SCRIPT_BYTES:
        raise SyncscopeError(
            f"{script}: more than {MAX_SCRIPT_BYTES >> 20} MiB, more than syncscope fix reads; "
            "give it the file that holds the loop"
        )
    return data


_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def _check_regular(script: Path) -> None:
    """The script is a regular file (through symlinks), or one line says what it is."""
    link = f"a symbolic link to {os.readlink(script)}, " if script.is_symlink() else ""
    try:
        mode = script.stat().st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SyncscopeError(
                f"{script}: a loop of symbolic links (no file at its end)"
            ) from None
        if isinstance(exc, FileNotFoundError):
            raise SyncscopeError(
                f"{script}: no such file" + (f" ({link}which does not exist)" if link else "")
            ) from None
        raise SyncscopeError(f"{script}: cannot read it ({exc.strerror})") from None
    if stat.S_ISDIR(mode):
        raise SyncscopeError(f"{script}: is a directory; give the training script's file")
    if not stat.S_ISREG(mode):
        kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
        raise SyncscopeError(
            f"{script}: {link}{kind}, not a file syncscope fix reads; give the training script's file"
        )


def _decode(script: Path, data: bytes) -> tuple[str, str]:
    """The script's text and the encoding to write it back in, as Python reads it: a PEP 263
    coding line, a UTF-8 byte-order mark (kept: ``utf-8-sig``), else UTF-8."""
    import io
    import tokenize

    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding), encoding
    except (SyntaxError, LookupError) as exc:
        raise SyncscopeError(f"{script}: cannot tell its text encoding ({exc})") from None
    except UnicodeDecodeError:
        raise SyncscopeError(f"{script}: not text in its declared encoding") from None


def _check_writable(script: Path) -> None:
    target = script.resolve()
    if not os.access(target, os.W_OK) or not os.access(target.parent, os.W_OK):
        raise SyncscopeError(f"{script}: cannot write it (read-only); nothing was changed")


def _check_inside(path: Path, allow_outside: bool) -> None:
    cwd = Path.cwd().resolve()
    if not allow_outside and not path.resolve().is_relative_to(cwd):
        raise SyncscopeError(
            f"{path} is outside the working tree {cwd}; pass --allow-outside to write it"
        )


def _print_problems(result: FixResult, shown: str, written: bool) -> None:
    for problem in result.problems:
        if problem.fixed:
            tail = "" if not result.changed else "(fixed)" if written else "(--apply fixes it)"
        else:
            tail = (
                f"(not rewritten: {problem.suggestion})"
                if problem.suggestion
                else "(not rewritten)"
            )
        print(
            f"{shown}:{problem.line}: {problem.code} {problem.message} {tail}".rstrip(),
            file=sys.stderr,
        )
        if problem.snippet and not problem.fixed:
            print(textwrap.indent(problem.snippet, "    "), file=sys.stderr)
    for note in result.notes:
        print(f"{shown}: {note}", file=sys.stderr)


def _verify(
    script: Path, result: FixResult, nproc_per_node: int, args: Sequence[str], encoding: str
) -> None:
    """Profile the original and the fixed script; refuse the fix unless it checks out."""
    from syncscope.fixes.verify import refusal, render, verify

    codes = [p.code for p in result.problems]
    launcher = ("--nproc-per-node", str(nproc_per_node))
    checked = verify(script, result.fixed, codes, launcher, args, encoding)
    print("\n".join(render(checked)))
    if not checked.ok:
        raise SyncscopeError(refusal(checked))


def _check_unchanged(script: Path, data: bytes) -> None:
    """Refuse to write over an edit made while fix ran (the rewrite is of what was read)."""
    try:
        now = _read(script)
    except SyncscopeError:
        now = b""
    if now != data:
        raise SyncscopeError(
            f"{script} changed while syncscope fix ran; nothing was written (run it again)"
        )


def _write(script: Path, text: bytes, backup: bool) -> None:
    """Write ``text`` over ``script`` (through a symlink, to the file it names), whole or
    not at all; with ``backup`` the original is kept first as ``SCRIPT.bak`` (or
    ``SCRIPT.bak.1`` ... where that name is taken)."""
    from syncscope.atomic import atomic_write, copy_fresh

    target = script.resolve()
    if backup:
        try:
            copy_fresh(target, target.with_name(target.name + ".bak"))
        except OSError as exc:
            raise SyncscopeError(f"{script}: cannot write it ({exc.strerror})") from None
    try:
        links = target.stat().st_nlink
        if links > 1:  # replacing it would leave its other names on the old text
            _write_in_place(target, text)
            print(
                f"syncscope: {script} has {links} hard links: written in place, so every "
                "name sees the fix",
                file=sys.stderr,
            )
        else:
            atomic_write(script, text, durable=True)
    except OSError as exc:
        raise SyncscopeError(f"{script}: cannot write it ({exc.strerror})") from None


def _write_in_place(target: Path, text: bytes) -> None:
    with target.open("r+b") as out:
        out.write(text)
        out.truncate()
        out.flush()
        os.fsync(out.fileno())
