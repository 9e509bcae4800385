"""What ``fix --from RUN`` does with the run's findings that are not loop rewrites.

The loop codemod (``codemod``) rewrites accumulation loops: where the sync toggle goes, the
step gate, the zero_grad. A profile finds more than that. Here:

- a forward through ``ddp_model.module(...)`` (missing-sync, ``wrapper-bypassed``) is
  rewritten to call the wrapper, ``ddp_model(...)``: the one edit that gives back the
  reduction the run lost (SYN110);
- every other error or warning of the run that no rewrite addressed is said in one line
  each, with the finding's own advice, and ``fix`` exits 1: a run with problems never ends
  in a silent 0 (``unaddressed_lines``).
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from syncscope.fixes.codemod import FixOptions, FixResult, Problem, RunFinding

BYPASS_CODE = "SYN110"


class _CallWrapper(cst.CSTTransformer):
    """``X.module(args)`` on the given lines becomes ``X(args)``."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, lines: frozenset[int]) -> None:
        super().__init__()
        self.lines = lines
        self.done: set[int] = set()

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        line = self.get_metadata(PositionProvider, original).start.line
        func = updated.func
        if line in self.lines and isinstance(func, cst.Attribute) and func.attr.value == "module":
            self.done.add(line)
            return updated.with_changes(func=func.value)
        return updated


def call_wrapper(source: str, lines: frozenset[int]) -> tuple[str, list[Problem]]:
    """``source`` with the forwards on ``lines`` that bypassed DDP calling the wrapper, and
    a problem for each line (fixed, or not where no ``X.module(...)`` call is there)."""
    if not lines:
        return source, []
    try:
        module = MetadataWrapper(cst.parse_module(source))
    except cst.ParserSyntaxError:
        return source, []
    transformer = _CallWrapper(lines)
    fixed = module.visit(transformer).code
    problems = [
        Problem(
            BYPASS_CODE,
            "wrapper-bypassed",
            line,
            "forward through the module inside DDP: its gradients are never reduced",
            fixed=True,
            span=(line, line),
        )
        for line in sorted(transformer.done)
    ]
    problems += [
        Problem(
            BYPASS_CODE,
            "wrapper-bypassed",
            line,
            "forward around the DDP wrapper: its gradients are never reduced",
            fixed=False,
            suggestion="call the DDP wrapper itself in the training forward",
        )
        for line in sorted(lines - transformer.done)
    ]
    return fixed, problems


def fix_with_run(source: str, options: FixOptions, path: str) -> FixResult:
    """``fix_source`` under a run's hints: the forwards that bypassed DDP call the wrapper
    first (line for line), then the loop is checked as the wrapper now sees it (a loop that
    never reached DDP syncs every micro-batch once it does: that is fixed in the same go)."""
    from syncscope.fixes.codemod import fix_source

    hints = options.hints
    called, problems = call_wrapper(source, hints.bypass_lines if hints else frozenset())
    result = fix_source(called, options, path=path)
    notes = result.notes
    if problems:  # the profile's finding did point here: not a loop, a forward
        notes = tuple(n for n in notes if not n.startswith("no finding of the profile"))
    return FixResult(source, result.fixed, (*problems, *result.problems), notes)


def unaddressed_lines(result: FixResult, findings: tuple[RunFinding, ...]) -> list[str]:
    """One line per finding of the run that the rewrite did not take care of (none when the
    rewrite changed the loop a finding points into)."""
    if result.changed or result.problems:
        return []
    return [
        f"{f.line}: {f.kind} ({f.cause}) is not a loop rewrite syncscope fix makes: {f.summary}"
        for f in findings
    ]
