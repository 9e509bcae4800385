"""Where a loop changes sync intent: the DDP flag, the FSDP setters, ``with`` toggles.

Each reader takes one direct statement of a micro loop and returns what it toggles: the
value given to ``require_backward_grad_sync`` or to ``set_requires_gradient_sync``, or the
``with`` statements (at its top, in its ``if`` branches or its ``match`` cases) with the
condition under which each lets gradients sync.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import libcst as cst

from syncscope.fixes.gates import Gate, code_of, parse_gate
from syncscope.fixes.syntax import contains, dotted, is_backward, no_sync_item

Covers = Literal["forward", "backward", "both", "none"]


def _simple_statements(statement: cst.BaseStatement) -> list[cst.BaseSmallStatement]:
    """Small statements of a line, or of an ``if`` body made of lines only (``if ddp:``)."""
    if isinstance(statement, cst.SimpleStatementLine):
        return list(statement.body)
    if (
        isinstance(statement, cst.If)
        and statement.orelse is None
        and isinstance(statement.body, cst.IndentedBlock)
        and all(isinstance(s, cst.SimpleStatementLine) for s in statement.body.body)
        and len(statement.body.body) == 1
    ):
        line = statement.body.body[0]
        assert isinstance(line, cst.SimpleStatementLine)
        return list(line.body)
    return []


def flag_value(statement: cst.BaseStatement) -> cst.BaseExpression | None:
    """``model.require_backward_grad_sync = value`` -> value."""
    for small in _simple_statements(statement):
        if (
            isinstance(small, cst.Assign)
            and isinstance(small.targets[0].target, cst.Attribute)
            and small.targets[0].target.attr.value == "require_backward_grad_sync"
        ):
            return small.value
    return None


def setter_value(statement: cst.BaseStatement) -> cst.BaseExpression | None:
    """``model.set_requires_gradient_sync(value)`` (or HSDP's ``set_requires_all_reduce``)
    -> value."""
    for small in _simple_statements(statement):
        call = small.value if isinstance(small, cst.Expr) else None
        if (
            isinstance(call, cst.Call)
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value in ("set_requires_gradient_sync", "set_requires_all_reduce")
            and call.args
        ):
            return call.args[0].value
    return None


def covers(with_node: cst.With, model: str) -> Covers:
    forward = contains(with_node, lambda c: dotted(c.func) == model)
    backward = contains(with_node, is_backward)
    if forward and backward:
        return "both"
    return "forward" if forward else "backward" if backward else "none"


def withs(
    statement: cst.BaseStatement, names: Mapping[str, cst.BaseExpression]
) -> list[tuple[cst.With, Gate | None]]:
    """``with`` statements at the top of ``statement`` or in its ``if`` branches, each with
    the condition under which it lets gradients sync (None if unconditional or unknown)."""
    if isinstance(statement, cst.With):
        no_sync = no_sync_item(statement.items[0].item, names)
        return [(statement, no_sync.sync if no_sync is not None else None)]
    found: list[tuple[cst.With, Gate | None]] = []
    if isinstance(statement, cst.Match):
        return _match_withs(statement, names)
    if isinstance(statement, cst.If):
        test = parse_gate(statement.test, names)
        branches: list[tuple[cst.BaseSuite, Gate | None]] = [
            (statement.body, test.negated() if test is not None else None)
        ]
        if isinstance(statement.orelse, cst.Else):
            branches.append((statement.orelse.body, test))
        for suite, sync in branches:
            if isinstance(suite, cst.IndentedBlock):
                for inner in suite.body:
                    if isinstance(inner, cst.With):
                        found.append((inner, sync))
    return found


def _match_withs(
    statement: cst.Match, names: Mapping[str, cst.BaseExpression]
) -> list[tuple[cst.With, Gate | None]]:
    """``with`` statements at the top of a ``match``'s cases. A case ``V`` runs when
    ``subject == V``; a wildcard case after exactly one value case runs when it does not."""
    subject = code_of(statement.subject)
    values = [c.pattern for c in statement.cases if isinstance(c.pattern, cst.MatchValue)]
    found: list[tuple[cst.With, Gate | None]] = []
    for case in statement.cases:
        runs: Gate | None = None
        if isinstance(case.pattern, cst.MatchValue):
            equal = parse_gate(
                cst.parse_expression(f"{subject} == {code_of(case.pattern.value)}"), names
            )
            runs = equal
        elif (
            isinstance(case.pattern, cst.MatchAs)
            and case.pattern.pattern is None
            and len(values) == 1
        ):
            other = f"{subject} == {code_of(values[0].value)}"
            equal = parse_gate(cst.parse_expression(other), names)
            runs = equal.negated() if equal is not None else None
        sync = runs.negated() if runs is not None else None  # no_sync here: syncs otherwise
        if isinstance(case.body, cst.IndentedBlock):
            found += [(inner, sync) for inner in case.body.body if isinstance(inner, cst.With)]
    return found
