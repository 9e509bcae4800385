"""Small syntactic predicates on libcst nodes: calls, backward, step, no_sync, zero_grad."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from syncscope.fixes.gates import Gate, code_of, parse_gate


class _Calls(cst.CSTVisitor):
    """Calls in evaluation order (arguments before the call), not inside nested scopes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[cst.Call] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def leave_Call(self, original_node: cst.Call) -> None:
        self.calls.append(original_node)


def calls_in(node: cst.CSTNode) -> list[cst.Call]:
    visitor = _Calls()
    node.visit(visitor)
    return visitor.calls


def contains(node: cst.CSTNode, predicate: Callable[[cst.Call], bool]) -> bool:
    return any(predicate(call) for call in calls_in(node))


def dotted(node: cst.CSTNode) -> str | None:
    """``model`` or ``self.model`` (a name, or attributes of a name), else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        owner = dotted(node.value)
        return None if owner is None else f"{owner}.{node.attr.value}"
    return None


_FLIPPED: dict[type[cst.BaseCompOp], type[cst.BaseCompOp]] = {
    cst.Equal: cst.NotEqual,
    cst.NotEqual: cst.Equal,
    cst.LessThan: cst.GreaterThanEqual,
    cst.GreaterThanEqual: cst.LessThan,
    cst.GreaterThan: cst.LessThanEqual,
    cst.LessThanEqual: cst.GreaterThan,
    cst.In: cst.NotIn,
    cst.NotIn: cst.In,
    cst.Is: cst.IsNot,
    cst.IsNot: cst.Is,
}


def negation(node: cst.BaseExpression) -> cst.BaseExpression:
    """``not node``, written as a person would: ``a != b`` -> ``a == b``, ``not x`` -> ``x``."""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
        inner = node.expression
        return inner.with_changes(lpar=(), rpar=()) if isinstance(inner, cst.Name) else inner
    if isinstance(node, cst.Comparison) and len(node.comparisons) == 1 and not node.lpar:
        target = node.comparisons[0]
        flipped = _FLIPPED.get(type(target.operator))
        if flipped is not None:
            operator = flipped(
                whitespace_before=target.operator.whitespace_before,  # type: ignore[call-arg, attr-defined]
                whitespace_after=target.operator.whitespace_after,  # type: ignore[call-arg, attr-defined]
            )
            return node.with_changes(comparisons=[target.with_changes(operator=operator)])
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
        return cst.Comparison(  # ``not (i % n)`` reads better as ``i % n == 0``
            left=node.with_changes(lpar=(), rpar=()),
            comparisons=[cst.ComparisonTarget(operator=cst.Equal(), comparator=cst.Integer("0"))],
        )
    if isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or node.lpar:
        return cst.UnaryOperation(operator=cst.Not(), expression=node)
    return cst.UnaryOperation(
        operator=cst.Not(),
        expression=node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]),
    )


def names_in(node: cst.CSTNode) -> set[str]:
    """Every name ``node`` mentions."""
    return {n.value for n in m.findall(node, m.Name()) if isinstance(n, cst.Name)}


def assigned_names(node: cst.CSTNode) -> set[str]:
    """The names ``node`` binds by assignment (``=``, ``+=``, annotated, ``:=``)."""
    found = m.findall(node, m.AssignTarget() | m.AugAssign() | m.AnnAssign() | m.NamedExpr())
    bound: set[str] = set()
    for target in found:
        value = getattr(target, "target", None)
        if value is not None:
            bound |= names_in(value)
    return bound


def method_name(call: cst.Call) -> str | None:
    return call.func.attr.value if isinstance(call.func, cst.Attribute) else None


def receiver(call: cst.Call) -> str | None:
    return code_of(call.func.value) if isinstance(call.func, cst.Attribute) else None


def is_backward(call: cst.Call) -> bool:
    return method_name(call) == "backward"


def is_step(call: cst.Call) -> bool:
    """``optimizer.step()`` or ``scaler.step(optimizer)``, not a scheduler's step."""
    if method_name(call) != "step":
        return False
    owner = (receiver(call) or "").lower()
    return "sched" not in owner and not owner.endswith("lr") and "warmup" not in owner


def stepped_optimizer(step: cst.Call) -> str | None:
    """The optimizer a step call steps: ``optimizer`` of ``optimizer.step()`` and of
    ``scaler.step(optimizer)``; None for a bare call."""
    if not isinstance(step.func, cst.Attribute):
        return None
    owner = code_of(step.func.value)
    if "scaler" in owner and step.args:
        return code_of(step.args[0].value)
    return owner


def is_zero_grad(call: cst.Call) -> bool:
    return method_name(call) == "zero_grad"


def statement_call(statement: cst.BaseStatement) -> cst.Call | None:
    """The call of a one-call statement line (``opt.zero_grad()``), else None."""
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        small = statement.body[0]
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            return small.value
    return None


def zero_grad_receiver(statement: cst.BaseStatement) -> str | None:
    call = statement_call(statement)
    return receiver(call) if call is not None and is_zero_grad(call) else None


def accumulate_model(item: cst.BaseExpression) -> str | None:
    """``accelerator.accumulate(model)`` -> ``"model"``."""
    if isinstance(item, cst.Call) and method_name(item) == "accumulate" and item.args:
        return dotted(item.args[0].value)
    return None


@dataclass(frozen=True)
class NoSync:
    """A ``with`` item that suppresses gradient sync for ``model``."""

    model: str
    sync: Gate | None  # when it lets gradients sync (None: unconditional or unknown)
    conditional: bool


def _bare_no_sync(node: cst.BaseExpression) -> str | None:
    """``model.no_sync()`` or ``accelerator.no_sync(model)`` -> the model's name."""
    if not isinstance(node, cst.Call) or method_name(node) != "no_sync":
        return None
    if node.args and dotted(node.args[0].value) is not None:
        return dotted(node.args[0].value)
    assert isinstance(node.func, cst.Attribute)
    return code_of(node.func.value)


def _called(node: cst.BaseExpression) -> cst.BaseExpression:
    """``model.no_sync`` chosen as a callable (called later, ``ctx()``): as if called."""
    if isinstance(node, cst.IfExp):
        return node.with_changes(body=_called(node.body), orelse=_called(node.orelse))
    if isinstance(node, (cst.Name, cst.Attribute)):
        return cst.Call(func=node)
    return node


def no_sync_item(
    item: cst.BaseExpression, names: Mapping[str, cst.BaseExpression], depth: int = 0
) -> NoSync | None:
    if isinstance(item, cst.Name) and item.value in names and depth < 3:
        return no_sync_item(names[item.value], names, depth + 1)
    if (
        isinstance(item, cst.Call)
        and not item.args
        and isinstance(item.func, cst.Name)
        and item.func.value in names
        and depth < 3
    ):  # ``ctx = model.no_sync if not last else contextlib.nullcontext`` ... ``with ctx():``
        return no_sync_item(_called(names[item.func.value]), names, depth + 1)
    model = _bare_no_sync(item)
    if model is not None:
        return NoSync(model, None, conditional=False)
    if isinstance(item, cst.IfExp):
        gate = parse_gate(item.test, names)
        model = _bare_no_sync(item.body)
        if model is not None:  # no_sync when the test holds: sync when it does not
            return NoSync(model, gate.negated() if gate is not None else None, True)
        model = _bare_no_sync(item.orelse)
        if model is not None:
            return NoSync(model, gate, True)
    return None


# calls a rewrite may remove: the sync toggles it replaces or moves, and the grad resets and
# steps it moves (a moved call is still there; a removed toggle is the fix)
_REWRITTEN = frozenset(
    {"no_sync", "set_requires_gradient_sync", "set_requires_all_reduce", "nullcontext", "zero_grad"}
)


class _Effects(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found: set[str] = set()

    def visit_Call(self, node: cst.Call) -> None:
        name = method_name(node) or (node.func.value if isinstance(node.func, cst.Name) else "")
        if name not in _REWRITTEN:  # the callee: a rewrite may change the arguments
            self.found.add(cst.Module([]).code_for_node(node.func) + "(...)")

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self.found.add(cst.Module([]).code_for_node(node))


def effects(node: cst.CSTNode) -> frozenset[str]:
    """The distinct callees and assignment expressions in ``node``, as code: what a faithful
    rewrite keeps (it may merge two calls of one callee, or change their arguments, never
    drop every call of one)."""
    visitor = _Effects()
    node.visit(visitor)
    return frozenset(visitor.found)
