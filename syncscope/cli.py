"""The ``syncscope`` command line: argparse (stdlib); each command lives in syncscope/commands/.

Each command module has ``add_parser(subparsers)``, which adds its subparser and sets
``run``: a function taking the parsed ``argparse.Namespace`` and returning the exit status
(``None``: 0). The command modules import nothing heavy at import time, so building the
parser costs milliseconds and ``syncscope --help`` starts fast.

``main(argv) -> int`` turns every usage error and SyncscopeError into one line on stderr and
an exit status (2), so no traceback from syncscope itself ever reaches the user.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from syncscope._version import __version__
from syncscope.errors import SyncscopeError

DESCRIPTION = "Find redundant, missing and misplaced gradient synchronizations in PyTorch training."

# Each module adds its command's subparser via ``add_parser(subparsers)``, in this order (the
# module of a command with a dash has an underscore: build-kernel, build_kernel.py).
COMMAND_MODULES = ("profile", "report", "analyze", "diff", "fix", "build-kernel")


class UsageError(Exception):
    """A command line argparse rejected; ``prog`` names the (sub)command, for the hint."""

    def __init__(self, message: str, prog: str) -> None:
        super().__init__(message)
        self.prog = prog


def _existing_file(token: str) -> bool:
    """``-x.py``: a file named like an option, not an option (no known option matched)."""
    import os

    return token != "-" and os.path.isfile(token)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise UsageError instead of printing usage and exiting.

    Two modes for commands that take another program's arguments:

    ``program_options``: options (``-m``, ``--module``) whose value starts the program. The
    first positional argument (SCRIPT), the value of one of these options (MODULE) or a
    ``--`` ends this parser's own options; every later argument, options included, belongs
    to the program and is stored, unparsed, as ``program`` (like ``python [OPTIONS] SCRIPT
    ARGS`` and ``python -m MODULE ARGS``). A ``--`` right before SCRIPT or right after MODULE
    is a separator, not the program's.

    ``intermixed``: positionals and options may be mixed (``fix SCRIPT --apply ARGS``).

    ``script_arguments``: the first positional argument (SCRIPT) is this parser's; every
    argument after it that is not one of this parser's own long options (``--apply``,
    ``--verify``, ...) belongs to the program, options included, in order, and is stored as
    ``program`` (``fix --verify train.py --steps 2 --cpu``); after a ``--`` every argument
    is the program's.
    """

    program_options: tuple[str, ...] | None = None
    intermixed: bool = False
    script_arguments: bool = False
    _inside_intermixed: bool = False
    # adds the arguments that cost an import to declare (profile: torchrun's options), once,
    # when this parser parses or shows its help: never merely to build the command line
    late_arguments: Callable[[Parser], None] | None = None

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.prog)

    def complete(self) -> None:
        """Add the ``late_arguments`` now, if not yet done."""
        late, self.late_arguments = self.late_arguments, None
        if late is not None:
            late(self)

    def format_usage(self) -> str:
        self.complete()
        return super().format_usage()

    def format_help(self) -> str:
        self.complete()
        return super().format_help()

    def parse_known_args(  # type: ignore[override]  # one signature for typeshed's overloads
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self.complete()
        arg_list = list(sys.argv[1:] if args is None else args)
        if self.program_options is not None:
            own, program = self._split_program(arg_list)
            parsed, extras = super().parse_known_args(own, namespace)
            parsed.program = program
            return parsed, extras
        if self.script_arguments:
            own, program = self._split_script_arguments(arg_list)
            parsed, extras = super().parse_known_args(own, namespace)
            parsed.program = program
            return parsed, extras
        if self.intermixed and not self._inside_intermixed:
            # parse_known_intermixed_args calls parse_known_args itself: once, not again
            self._inside_intermixed = True
            try:
                return self.parse_known_intermixed_args(arg_list, namespace)
            finally:
                self._inside_intermixed = False
        return super().parse_known_args(arg_list, namespace)

    def _split_script_arguments(self, args: list[str]) -> tuple[list[str], list[str]]:
        """(this parser's own arguments, the program's): see ``script_arguments``."""
        own: list[str] = []
        program: list[str] = []
        dashed: list[str] = []  # a SCRIPT named like an option: given to argparse after ``--``
        actions = self._option_string_actions
        seen_script = False
        i = 0
        while i < len(args):
            token = args[i]
            if token == "--":
                if seen_script:
                    return own + (["--", *dashed] if dashed else []), program + args[i + 1 :]
                own.extend(args[i : i + 2])  # ``-- SCRIPT``: a script named like an option
                seen_script = i + 1 < len(args)
                i += 2
                continue
            name, eq, _ = token.partition("=")
            action = actions.get(name) if token.startswith("--") else None
            if not seen_script and token.startswith("-") and token != "-":
                action = actions.get(name)
            if action is not None and (not seen_script or name not in ("-h", "--help")):
                end = i + 1 if eq or action.nargs == 0 else i + 2
                own.extend(args[i:end])
                i = end
                continue
            if not seen_script and not token.startswith("-"):
                own.append(token)
                seen_script = True
            elif not seen_script and _existing_file(token):  # ``-x.py``: SCRIPT, after a ``--``
                dashed = [token]
                seen_script = True
            elif seen_script:
                program.append(token)
            else:
                own.append(token)  # an unknown option before SCRIPT: argparse says so
            i += 1
        return own + (["--", *dashed] if dashed else []), program

    def _split_program(self, args: list[str]) -> tuple[list[str], list[str]]:
        """(this parser's own arguments, the program's): see ``program_options``."""

        def after(end: int) -> tuple[list[str], list[str]]:  # -m MODULE [--] ARGS
            return args[:end], args[end + 1 :] if args[end : end + 1] == ["--"] else args[end:]

        starts = self.program_options or ()
        actions = self._option_string_actions
        i = 0
        while i < len(args):
            token = args[i]
            if token == "--":
                return args[:i], args[i + 1 :]
            if token == "-" or not token.startswith("-"):
                return args[:i], args[i:]  # SCRIPT
            if token.startswith("--"):
                name, eq, _ = token.partition("=")
                action = actions.get(name)
                end = i + 1 if eq or action is None or action.nargs == 0 else i + 2
                if name in starts:
                    return after(end)
                i = end
                continue
            # short options, possibly clustered or with the value attached: -q, -oDIR, -qm MOD
            end = i + 1
            for j in range(1, len(token)):
                option = "-" + token[j]
                action = actions.get(option)
                if action is None or action.nargs != 0:  # unknown, or takes the rest as value
                    if action is not None and j == len(token) - 1:
                        end = i + 2  # the value is the next argument
                    if option in starts:
                        return after(end)
                    break
            i = end
        return args, []


def build_parser(command: str | None = None) -> Parser:
    """The whole parser, or with ``command`` only that command's subparser: a command's
    module (``profile``'s is large) is imported only when it runs or ``--help`` lists it."""
    parser = Parser(prog="syncscope", description=DESCRIPTION, allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"syncscope {__version__}")
    subparsers = parser.add_subparsers(
        title="commands", dest="command", metavar="COMMAND", required=True, parser_class=Parser
    )
    for name in COMMAND_MODULES if command not in COMMAND_MODULES else (command,):
        module = importlib.import_module(f"syncscope.commands.{name.replace('-', '_')}")
        module.add_parser(subparsers)
    return parser


def error(message: str) -> None:
    """Print one error line to stderr."""
    from syncscope.text import visible  # a path or a script's text may carry escapes

    print(f"syncscope: error: {visible(message)}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args[0] if args else None)
    if not args:
        parser.print_help(sys.stderr)
        return 2
    try:
        if args[0].startswith("-") and args[0] not in ("-h", "--help", "--version"):
            raise UsageError(f"unknown option {args[0]} (a command comes first)", "syncscope")
        try:
            namespace, extras = parser.parse_known_args(args)
        except SystemExit as exc:  # --help: printed on stdout
            return exc.code if isinstance(exc.code, int) else 0
        if extras:
            command = f"syncscope {namespace.command}"
            raise UsageError(f"unrecognized arguments: {' '.join(extras)}", command)
        run: Any = namespace.run
        result = run(namespace)
    except UsageError as exc:
        error(f"{exc} (see '{exc.prog} --help')")
        return 2
    except SyncscopeError as exc:
        error(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        error("interrupted")
        return 130
    except ModuleNotFoundError as exc:
        if exc.name != "torch":  # torch itself missing; anything else is a bug to show
            raise
        error(needs_torch(args[0]))
        return 2
    return int(result or 0)


def needs_torch(command: str) -> str:
    """The line for a command that needs torch where none is installed (``fix --check``,
    ``analyze``, ``report`` and ``diff`` read files and run without it)."""
    return (
        f"{command} needs torch, which is not installed in this environment: "
        "install the torch your job uses first (pip install torch), then run it again"
    )
