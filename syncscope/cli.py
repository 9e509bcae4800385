"""The ``syncscope`` command line: a thin typer app; each command lives in syncscope/commands/.

``main(argv) -> int`` turns every usage error and SyncscopeError into one line on stderr and
an exit status (2), so no traceback from syncscope itself ever reaches the user.
"""

from __future__ import annotations

import importlib
import sys

import typer

try:  # typer >= 0.20 vendors its own click
    from typer._click import exceptions as click_errors  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as click_errors  # type: ignore[no-redef,unused-ignore]

from syncscope.errors import SyncscopeError

app = typer.Typer(
    name="syncscope",
    help="Find redundant, missing and misplaced gradient synchronizations in PyTorch training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _root() -> None:
    """Find redundant, missing and misplaced gradient synchronizations in PyTorch training."""


# Each module registers its command(s) on ``app`` via ``register(app)``.
COMMAND_MODULES = ("profile", "report", "analyze", "diff", "fix")


def _register_all() -> None:
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"syncscope.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"syncscope.commands.{name}":
                continue  # command not built yet
            raise
        module.register(app)


_register_all()


def error(message: str) -> None:
    """Print one error line to stderr."""
    print(f"syncscope: error: {message}", file=sys.stderr)


def _module_args_are_the_programs(args: list[str]) -> list[str]:
    """``profile -m MODULE ARGS...``: like ``python -m``, everything after MODULE belongs
    to the module, options included; end syncscope's own options there."""
    if not args or args[0] != "profile":
        return args
    for i, token in enumerate(args):
        if token == "--":
            break
        if token in ("-m", "--module") and i + 2 < len(args) and args[i + 2] != "--":
            return [*args[: i + 2], "--", *args[i + 2 :]]
        if token.startswith("--module="):
            return [*args[: i + 1], "--", *args[i + 1 :]] if i + 1 < len(args) else args
    return args


def main(argv: list[str] | None = None) -> int:
    args = _module_args_are_the_programs(list(sys.argv[1:] if argv is None else argv))
    try:
        result = app(args=args, prog_name="syncscope", standalone_mode=False)
    except click_errors.NoArgsIsHelpError as exc:
        print(exc.ctx.get_help() if exc.ctx else "", file=sys.stderr)
        return 2
    except click_errors.UsageError as exc:
        name = exc.ctx.command_path if exc.ctx else "syncscope"
        hint = f" (see '{name} --help')"
        error(f"{exc.format_message()}{hint}")
        return 2
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        error("aborted")
        return 130
    except SyncscopeError as exc:
        error(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        error("interrupted")
        return 130
    return int(result or 0)
