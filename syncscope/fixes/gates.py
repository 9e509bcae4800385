"""Gates in canonical form: "is this micro-batch the last of its window?".

A step gate (``if (i + 1) % accum == 0:``), a sync condition (``model.no_sync() if not
is_last ...``), a flag value (``micro_step == grad_accum_steps - 1``) are all predicates on
a counter. Two forms cover what scripts write:

- ``mod``: ``(var + offset) % n == 0``, for a counter that runs across windows;
- ``last``: ``var + offset == n``, for an inner micro-step loop's index.

With ``base``, the counter's value at micro-batch 0, a predicate is *right* when
``base + offset == 1`` (it fires on the window's last micro-batch) and off by one when it is 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import libcst as cst

_EMPTY = cst.Module(body=[])


def code_of(node: cst.CSTNode) -> str:
    """Source text of a node, as libcst renders it."""
    return _EMPTY.code_for_node(node)


@dataclass(frozen=True)
class Pred:
    """``(var + offset) % n == 0`` (form ``mod``) or ``var + offset == n`` (form ``last``)."""

    var: str
    form: Literal["mod", "last"]
    offset: int
    n: str


@dataclass(frozen=True)
class Gate:
    """A predicate and its polarity: ``positive`` means the expression is true when it fires."""

    pred: Pred
    positive: bool

    def negated(self) -> Gate:
        return Gate(self.pred, not self.positive)


def _var_and_offset(node: cst.BaseExpression) -> tuple[str, int] | None:
    if isinstance(node, cst.Name):
        return node.value, 0
    if (
        isinstance(node, cst.BinaryOperation)
        and isinstance(node.operator, cst.Add)
        and isinstance(node.left, cst.Name)
        and isinstance(node.right, cst.Integer)
    ):
        return node.left.value, int(node.right.value)
    return None


def _minus_one(text: str) -> str | None:
    """``"accum - 1"`` -> ``"accum"``; anything else -> None."""
    if text.endswith(" - 1"):
        stripped = text[: -len(" - 1")]
        return stripped[1:-1] if stripped.startswith("(") and stripped.endswith(")") else stripped
    return None


def _comparison(node: cst.Comparison) -> Gate | None:
    if len(node.comparisons) != 1:
        return None
    target = node.comparisons[0]
    operator = target.operator
    right = code_of(target.comparator)
    left = node.left
    if isinstance(operator, (cst.Equal, cst.NotEqual)):
        positive = isinstance(operator, cst.Equal)
        if isinstance(left, cst.BinaryOperation) and isinstance(left.operator, cst.Modulo):
            var_offset = _var_and_offset(left.left)
            if var_offset is None:
                return None
            n = code_of(left.right)
            if right == "0":
                return Gate(Pred(var_offset[0], "mod", var_offset[1], n), positive)
            if _minus_one(right) == n:
                return Gate(Pred(var_offset[0], "mod", var_offset[1] + 1, n), positive)
            return None
        var_offset = _var_and_offset(left)
        if var_offset is None:
            return None
        n_minus = _minus_one(right)
        if n_minus is not None:
            return Gate(Pred(var_offset[0], "last", var_offset[1] + 1, n_minus), positive)
        return Gate(Pred(var_offset[0], "last", var_offset[1], right), positive)
    if isinstance(operator, cst.LessThan):
        # ``micro < accum - 1`` is "not the last micro-batch" for an index below n.
        var_offset = _var_and_offset(left)
        n_minus = _minus_one(right)
        if var_offset is None:
            return None
        if n_minus is not None:
            return Gate(Pred(var_offset[0], "last", var_offset[1] + 1, n_minus), False)
        return Gate(Pred(var_offset[0], "last", var_offset[1] + 1, right), False)
    return None


def parse_gate(
    node: cst.BaseExpression, names: Mapping[str, cst.BaseExpression], depth: int = 0
) -> Gate | None:
    """Canonicalize ``node``; ``names`` maps local names (``is_last``) to their values."""
    if depth > 4:
        return None
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
        inner = parse_gate(node.expression, names, depth + 1)
        return inner.negated() if inner is not None else None
    if isinstance(node, cst.Name) and node.value in names:
        return parse_gate(names[node.value], names, depth + 1)
    if isinstance(node, cst.Comparison):
        return _comparison(node)
    return None


def effective(gate: Gate, bases: Mapping[str, int]) -> int | None:
    """``base + offset`` of a gate's counter, or None when its base is unknown."""
    base = bases.get(gate.pred.var)
    return None if base is None else base + gate.pred.offset


def agree(a: Gate, b: Gate, bases: Mapping[str, int]) -> bool | None:
    """Do two gates fire on the same micro-batches? None when that cannot be told."""
    if a.pred.form != b.pred.form or a.pred.n != b.pred.n:
        return None
    if a.pred.var == b.pred.var:
        return a.pred.offset == b.pred.offset and a.positive == b.positive
    ea, eb = effective(a, bases), effective(b, bases)
    if ea is None or eb is None:
        return None
    return ea == eb and a.positive == b.positive
