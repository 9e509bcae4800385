"""``syncscope build-kernel``: build the compiled collective kernel now, and wait for it.

``syncscope profile`` never waits on the compiler: until the kernel is built it records with
the Python kernel and starts the build in the background once its run ends. This command is
the moment the user chooses instead (a fresh machine, a CI image): it shows what it builds,
where, each step as it ends and the time it took (syncscope.capture.native).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from syncscope.capture.native.cache import Place
    from syncscope.cli import Parser

SUMMARY = "Build syncscope's compiled collective kernel for this torch now (profile never waits)."
STEPS = {"1": "compiled c10d_kernel.cpp", "2": "linked the module"}
BEAT_S = 15.0  # seconds between the lines that say it is still building, off a terminal


def add_parser(subparsers: argparse._SubParsersAction[Parser]) -> None:
    parser = subparsers.add_parser(
        "build-kernel", help=SUMMARY, description=SUMMARY, allow_abbrev=False
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="Build again even if a verified module is there (e.g. after a compiler update).",
    )
    parser.set_defaults(run=run)


class _Progress:
    """The build's steps as they end, with the time since the start; on a terminal, a line
    that counts the seconds meanwhile."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.start = time.monotonic()
        self.tty = stream.isatty()
        self.step = "compiling c10d_kernel.cpp"
        self.pending = ""
        self.beat = BEAT_S

    def elapsed(self) -> str:
        return f"{time.monotonic() - self.start:.1f} s"

    def line(self, text: str) -> None:
        """One line of the build's log: ninja's ``[k/n] ...`` when a step ends (told once
        the next line shows it did not fail), or a note of the builder's."""
        pending, self.pending = self.pending, ""
        if pending and not text.startswith("FAILED:"):
            self.say(pending)
        if text.startswith("[") and "/" in text.split("]")[0]:
            done, _, total = text[1:].split("]")[0].partition("/")
            what = STEPS.get(done, "a step") if total == "2" else "a step"
            self.pending = f"[{done}/{total}] {what} ({self.elapsed()})"
            self.step = "linking" if done == "1" else "loading the module to check it"
        elif text.startswith(("syncscope: note: ", "syncscope: waiting", "syncscope: stopped")):
            self.say(text.removeprefix("syncscope: "))

    def say(self, text: str) -> None:
        end = "\r\x1b[K" if self.tty else ""
        print(f"{end}syncscope: {text}", file=self.stream, flush=True)

    def tick(self) -> None:
        """A few times a second while it builds: on a terminal, the line counting seconds;
        elsewhere (a CI log) a line every ``BEAT_S`` seconds."""
        if self.tty:
            print(f"\r\x1b[Ksyncscope: {self.step}... {self.elapsed()}", end="", file=self.stream)
            self.stream.flush()
        elif time.monotonic() - self.start >= self.beat:
            self.beat += BEAT_S
            self.say(f"{self.step}... {self.elapsed()}")


def run(args: argparse.Namespace) -> int:
    from syncscope.capture import native
    from syncscope.capture.native import cache
    from syncscope.errors import SyncscopeError
    from syncscope.text import visible

    try:
        native.setting()
    except ValueError as exc:
        raise SyncscopeError(str(exc)) from None
    progress = _Progress(sys.stderr)
    try:
        where = cache.place()
    except ModuleNotFoundError as exc:
        if exc.name == "torch":
            raise  # no torch at all: the command line says it needs torch
        raise SyncscopeError(f"no extension directory: {exc}", exit_code=1) from None
    except Exception as exc:  # a torch that cannot say where its extensions go
        raise SyncscopeError(f"no extension directory: {exc}", exit_code=1) from None
    needed = args.force or bool(cache.verify(where))
    if needed:
        _start(where, args.force, progress)
    path, why = native.build(progress.line, progress.tick)
    if progress.tty:
        print("\r\x1b[K", end="", file=sys.stderr)
    if path is None:
        raise SyncscopeError(f"the compiled collective kernel was not built: {why}", exit_code=1)
    done = f"built in {progress.elapsed()}" if needed else "already built, and verified"
    print(visible(f"syncscope: compiled collective kernel {done}: {path}"))
    return 0


def _start(where: Place, force: bool, progress: _Progress) -> None:
    """Say what is built, where, with what; ``force``: forget the module built before."""
    import torch

    from syncscope.capture.native import cache
    from syncscope.text import visible

    if force:
        cache.forget_built(where)
    compiler = cache.compiler()
    progress.say(
        visible(
            f"building the compiled collective kernel for torch {torch.__version__} with "
            f"{compiler} into {where.directory} (ninja; steps are shown as they end)"
        )
    )
