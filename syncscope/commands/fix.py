"""``syncscope fix SCRIPT``: propose (or apply) rewrites of gradient-accumulation loops.

Dry run by default: a unified diff on stdout and one line per problem on stderr. Exit
status: 0 nothing to fix, 1 problems found (dry run) or left unfixed (``--apply``), 2 error.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from syncscope.errors import SyncscopeError

if TYPE_CHECKING:  # libcst is imported only when the command runs
    from syncscope.cli import Parser
    from syncscope.fixes.codemod import FixResult, Style

SUMMARY = "Propose (dry run) or --apply fixes to gradient-accumulation loops."


def _check_inside(path: Path, allow_outside: bool) -> None:
    cwd = Path.cwd().resolve()
    if not allow_outside and not path.resolve().is_relative_to(cwd):
        raise SyncscopeError(
            f"{path} is outside the working tree {cwd}; pass --allow-outside to write it"
        )


def _read(script: Path) -> bytes:
    if not script.is_file():
        raise SyncscopeError(f"{script}: no such file")
    try:
        return script.read_bytes()
    except OSError as exc:
        raise SyncscopeError(f"{script}: cannot read it ({exc.strerror})") from None


def write_atomically(script: Path, text: str, backup: bool) -> None:
    """Write ``text`` to ``script`` via a temporary file and a rename; keep ``SCRIPT.bak``."""
    import shutil  # here, not at the top: every syncscope command builds this parser
    import tempfile

    target = script.resolve()  # a symlink is written through, to the file it names
    directory = target.parent
    try:
        if backup:
            _copy_fresh(target, target.with_name(target.name + ".bak"))
        handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=directory)
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(text.encode("utf-8"))
                out.flush()
                os.fsync(out.fileno())
            shutil.copymode(target, temporary)
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise SyncscopeError(f"{script}: cannot write it ({exc.strerror})") from None


def fresh_name(path: Path) -> Path:
    """``path``, else ``path.1``, ``path.2`` ...: the first name no file has."""
    candidate, n = path, 0
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


def _copy_fresh(source: Path, wanted: Path) -> Path:
    """Copy ``source`` to a new file named like ``wanted`` (never over an existing one)."""
    import shutil

    data = source.read_bytes()
    while True:
        path = fresh_name(wanted)
        try:
            with open(path, "xb") as out:  # exclusive: a file made meanwhile is not replaced
                out.write(data)
        except FileExistsError:
            continue
        shutil.copystat(source, path)
        return path


def _report(result: FixResult, shown: str) -> None:
    for problem in result.problems:
        if problem.fixed:
            tail = "(fixed)" if result.changed else ""
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
    for note in result.notes:
        print(f"{shown}: {note}", file=sys.stderr)


def fix(
    script: Path,
    args: Sequence[str] = (),
    apply: bool = False,
    style: str = "auto",
    from_run: Path | None = None,
    verify: bool = False,
    nproc_per_node: int = 2,
    no_backup: bool = False,
    allow_outside: bool = False,
) -> int:
    """Propose (dry run) or --apply fixes to gradient-accumulation loops."""
    from syncscope.fixes.codemod import STYLES, FixOptions, fix_source

    if style not in STYLES:
        raise SyncscopeError(f"--style must be one of {', '.join(STYLES)}, not {style!r}")
    data = _read(script)
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SyncscopeError(f"{script}: not UTF-8 text") from None
    hints = None
    if from_run is not None:
        from syncscope.fixes.fromrun import load_hints

        hints = load_hints(from_run, script, data)
    chosen: Style = style  # type: ignore[assignment]
    result = fix_source(source, FixOptions(chosen, hints), path=str(script))
    if result.changed and not apply:
        sys.stdout.write(result.diff(str(script)))
    _report(result, str(script))
    if verify and result.changed:
        from syncscope.fixes.verify import render
        from syncscope.fixes.verify import verify as run_verify

        _check_inside(script, allow_outside)
        codes = [p.code for p in result.problems]
        checked = run_verify(
            script, result.fixed, codes, ("--nproc-per-node", str(nproc_per_node)), args or ()
        )
        print("\n".join(render(checked)))
        if not checked.ok:
            raise SyncscopeError("verification failed: the fix was not applied")
    if apply and result.changed:
        _check_inside(script, allow_outside)
        write_atomically(script, result.fixed, backup=not no_backup)
        print(f"syncscope: wrote {script}", file=sys.stderr)
    unfixed = any(not p.fixed for p in result.problems)
    return 1 if result.problems and (not apply or unfixed) else 0


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
        "--style",
        default="auto",
        help="auto, accelerate, no_sync, flag or fsdp2. (default: %(default)s)",
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
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    return fix(
        args.script,
        args.program,
        apply=args.apply,
        style=args.style,
        from_run=args.from_run,
        verify=args.verify,
        nproc_per_node=args.nproc_per_node,
        no_backup=args.no_backup,
        allow_outside=args.allow_outside,
    )
