"""Statement-level rewrites: each returns an ``Edit`` keyed by original nodes.

An edit function gets the node as already transformed below it and returns its replacement
(a node, several statements, or removal). Rewrites work on a micro loop's direct statements
by index, so comments and blank lines attached to statements move with them.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from syncscope.fixes.gates import code_of
from syncscope.fixes.loops import AccumLoop, Toggle, is_continue_gate
from syncscope.fixes.syntax import (
    assigned_names,
    calls_in,
    is_zero_grad,
    names_in,
    negation,
    no_sync_item,
)

Replacement = cst.CSTNode | cst.FlattenSentinel[cst.BaseStatement] | cst.RemovalSentinel
EditFn = Callable[[cst.CSTNode], Replacement]
Statements = list[cst.BaseStatement]


@dataclass
class Edit:
    """Replacements keyed by ``id`` of original nodes, plus modules to import."""

    replace: dict[int, EditFn] = field(default_factory=dict)
    imports: tuple[str, ...] = ()


class _Apply(cst.CSTTransformer):
    def __init__(self, edit: Edit) -> None:
        super().__init__()
        self.edit = edit

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Replacement:  # type: ignore[override]
        fn = self.edit.replace.get(id(original_node))
        return updated_node if fn is None else fn(updated_node)


def apply_edit(module: cst.Module, edit: Edit) -> cst.Module:
    result = module.visit(_Apply(edit))
    assert isinstance(result, cst.Module)
    return result


def statement(code: str) -> cst.BaseStatement:
    return cst.parse_statement(code + "\n")


def expression(code: str) -> cst.BaseExpression:
    return cst.parse_expression(code)


def _take_leading(first: cst.BaseStatement, onto: cst.BaseStatement) -> Statements:
    """Move ``first``'s comments and blank lines onto ``onto``; return [onto', first']."""
    leading = getattr(first, "leading_lines", ())
    return [
        onto.with_changes(leading_lines=leading),
        first.with_changes(leading_lines=()),
    ]


def _unwrap_with(node: cst.With) -> Statements:
    """A ``with`` statement replaced by its body (comments before it are kept)."""
    body = list(node.body.body) if isinstance(node.body, cst.IndentedBlock) else []
    if not body:
        return [statement("pass")]
    body[0] = body[0].with_changes(
        leading_lines=[*node.leading_lines, *getattr(body[0], "leading_lines", ())]
    )
    return body


def same_statement(a: cst.BaseStatement, b: cst.BaseStatement) -> bool:
    """The same code, comments and layout aside (compared as Python's syntax trees)."""
    import ast

    def tree(node: cst.BaseStatement) -> str:
        return ast.dump(ast.parse(textwrap.dedent(code_of(node.with_changes(leading_lines=())))))

    return tree(a) == tree(b)


def _strip_statement(node: cst.BaseStatement, names: dict[str, cst.BaseExpression]) -> Statements:
    """Remove sync toggles from one direct statement of a micro loop."""
    if isinstance(node, cst.With) and (
        no_sync_item(node.items[0].item, names) is not None
        or "accumulate" in code_of(node.items[0].item)
    ):
        return _unwrap_with(node)
    if isinstance(node, cst.If) and isinstance(node.body, cst.IndentedBlock):
        branches = [list(node.body.body)]
        if isinstance(node.orelse, cst.Else) and isinstance(node.orelse.body, cst.IndentedBlock):
            branches.append(list(node.orelse.body.body))
        stripped = [
            [
                s
                for part in branch
                for s in (_unwrap_with(part) if isinstance(part, cst.With) else [part])
            ]
            for branch in branches
        ]
        if len(stripped) == 2:
            return _hoisted(node, branches, stripped)
        return [node.with_changes(body=node.body.with_changes(body=stripped[0]))]
    return [node]


def _hoisted(node: cst.If, branches: list[Statements], stripped: list[Statements]) -> Statements:
    """An if/else whose branches start alike once the toggles are gone: the shared
    statements before it, then what is left of it (nothing, when the branches were the
    same; ``if not test:`` when only the ``else`` keeps statements). The shared statements
    are the branch's that had no toggle: a comment inside a removed ``with`` went with it."""
    body, orelse = stripped
    shared = 0
    while shared < min(len(body), len(orelse)) and same_statement(body[shared], orelse[shared]):
        shared += 1
    if shared == 0:
        assert isinstance(node.orelse, cst.Else)
        else_block = node.orelse.body.with_changes(body=orelse)
        return [
            node.with_changes(
                body=node.body.with_changes(body=body),
                orelse=node.orelse.with_changes(body=else_block),
            )
        ]
    plain = 1 if any(isinstance(s, cst.With) for s in branches[0]) else 0
    head = list(stripped[plain][:shared])
    head[0] = head[0].with_changes(leading_lines=[*node.leading_lines, *head[0].leading_lines])  # type: ignore[attr-defined]
    rest_body, rest_else = body[shared:], orelse[shared:]
    assert isinstance(node.body, cst.IndentedBlock)
    if not rest_body and not rest_else:
        return head
    if not rest_else:
        tail = node.with_changes(body=node.body.with_changes(body=rest_body), orelse=None)
    elif not rest_body:
        tail = node.with_changes(
            test=negation(node.test), body=node.body.with_changes(body=rest_else), orelse=None
        )
    else:
        assert isinstance(node.orelse, cst.Else)
        else_block = node.orelse.body.with_changes(body=rest_else)
        tail = node.with_changes(
            body=node.body.with_changes(body=rest_body),
            orelse=node.orelse.with_changes(body=else_block),
        )
    return [*head, tail.with_changes(leading_lines=())]


def strip_toggles(loop: AccumLoop, toggles: Sequence[Toggle]) -> Edit:
    """Remove ``toggles`` (unwrap ``no_sync``/``accumulate``, drop flags and setters)."""
    indices = {t.index for t in toggles}

    def rebuild(body: Statements) -> Statements:
        out: Statements = []
        taken = 0  # statements after a ``continue`` gate that moved above it
        for index, node in enumerate(body):
            if taken:
                taken -= 1
            elif index not in indices:
                out.append(node)
            elif isinstance(node, cst.SimpleStatementLine) or _is_toggle_if(node):
                if out or index + 1 < len(body):
                    continue
                out.append(statement("pass"))
            else:
                stripped = _strip_statement(node, loop.names)
                if len(stripped) == 1 and is_continue_gate(stripped[0]):
                    stripped, taken = _hoisted_continue(stripped[0], body[index + 1 :])
                out.extend(stripped)
        return out

    return Edit({id(loop.loop): _body_edit(rebuild)})


def _hoisted_continue(node: cst.BaseStatement, after: Statements) -> tuple[Statements, int]:
    """``if test: X; continue`` followed by ``X``: ``X`` once, then ``if test: continue``;
    also how many of the statements ``after`` it that took."""
    assert isinstance(node, cst.If) and isinstance(node.body, cst.IndentedBlock)
    inner = list(node.body.body[:-1])
    following = list(after[: len(inner)])
    if not inner or len(following) < len(inner):
        return [node], 0
    if not all(same_statement(a, b) for a, b in zip(inner, following, strict=True)):
        return [node], 0
    following[0] = following[0].with_changes(
        leading_lines=[*node.leading_lines, *getattr(following[0], "leading_lines", ())]
    )
    gate = node.with_changes(body=node.body.with_changes(body=node.body.body[-1:]))
    return [*following, gate.with_changes(leading_lines=())], len(inner)


def extend_with_over_forward(block: cst.CSTNode, forward: int, at: int) -> Edit | None:
    """The ``with`` at direct statement ``at`` of ``block`` (a loop or a function) made to
    hold the statements from the ``forward`` on as well: the smallest fix of a ``no_sync``
    around the backward only. Statements in between that its header reads (``ctx = ...``)
    stay before it; None when those read what the forward computes."""
    body = _suite_of(block)
    node = body[at]
    assert isinstance(node, cst.With)
    header = set().union(*(names_in(item) for item in node.items))
    span = list(body[forward:at])
    before = [s for s in span if assigned_names(s) & header]
    moved = [s for s in span if not assigned_names(s) & header]
    computed = set().union(set(), *(assigned_names(s) for s in moved))
    if not moved or any(names_in(s) & computed for s in before):
        return None

    def rebuild(statements: Statements) -> Statements:
        with_node = statements[at]
        assert isinstance(with_node, cst.With) and isinstance(with_node.body, cst.IndentedBlock)
        inner = [moved[0].with_changes(leading_lines=()), *moved[1:], *with_node.body.body]
        leading = [*getattr(span[0], "leading_lines", ()), *with_node.leading_lines]
        wrapped = with_node.with_changes(
            body=with_node.body.with_changes(body=inner), leading_lines=()
        )
        head = [*before, wrapped]
        head[0] = head[0].with_changes(leading_lines=leading)
        return [*statements[:forward], *head, *statements[at + 1 :]]

    return Edit({id(block): _body_edit(rebuild)})


def _suite_of(block: cst.CSTNode) -> Statements:
    suite = getattr(block, "body", None)
    return list(suite.body) if isinstance(suite, cst.IndentedBlock) else []


def _is_toggle_if(node: cst.BaseStatement) -> bool:
    """``if ddp:`` holding one flag or setter line (nanoGPT's form)."""
    if not isinstance(node, cst.If) or node.orelse is not None:
        return False
    body = node.body.body if isinstance(node.body, cst.IndentedBlock) else ()
    text = code_of(node.body)
    return len(body) == 1 and (
        "require_backward_grad_sync" in text
        or "set_requires_gradient_sync" in text
        or "set_requires_all_reduce" in text
    )


def _body_edit(rebuild: Callable[[Statements], Statements]) -> EditFn:
    def fn(node: cst.CSTNode) -> Replacement:
        assert isinstance(node, (cst.For, cst.While, cst.FunctionDef))
        assert isinstance(node.body, cst.IndentedBlock)
        return node.with_changes(body=node.body.with_changes(body=rebuild(list(node.body.body))))

    return fn


def wrap_span(
    loop: AccumLoop,
    header: str,
    setup: Sequence[str],
    gate_code: str | None,
    span_fix: Callable[[Statements], Statements] | None = None,
) -> Edit:
    """Wrap the forward..backward statements in ``header`` (a ``with ...:`` line), after
    the ``setup`` lines; set the step gate's test to ``gate_code`` when given."""
    start, end = loop.forward, loop.backward

    def rebuild(body: Statements) -> Statements:
        span = body[start : end + 1]
        if span_fix is not None:
            span = span_fix(span)
        leading = getattr(span[0], "leading_lines", ())
        inner = [span[0].with_changes(leading_lines=()), *span[1:]]
        template = statement(f"{header}\n    pass")
        assert isinstance(template, cst.With) and isinstance(template.body, cst.IndentedBlock)
        new = [
            *(statement(code) for code in setup),
            template.with_changes(body=template.body.with_changes(body=inner)),
        ]
        new[0] = new[0].with_changes(leading_lines=leading)
        rest = body[end + 1 :]
        if gate_code is not None and loop.gate_index is not None:
            at = loop.gate_index - end - 1
            gate = rest[at]
            assert isinstance(gate, cst.If)
            rest[at] = gate.with_changes(test=expression(gate_code))
        return [*body[:start], *new, *rest]

    return Edit({id(loop.loop): _body_edit(rebuild)})


def insert_before_forward(
    loop: AccumLoop, lines: Sequence[str], move: int | None, gate_name: str | None
) -> Edit:
    """Insert ``lines`` (or move direct statement ``move``) just before the forward."""

    def rebuild(body: Statements) -> Statements:
        moved = [body[move]] if move is not None else []
        new = [*(statement(code) for code in lines), *moved]
        first = body[loop.forward]
        head = _take_leading(first, new[0])
        own = getattr(new[0], "leading_lines", ())
        head[0] = head[0].with_changes(leading_lines=[*head[0].leading_lines, *own])  # type: ignore[attr-defined]
        out: Statements = []
        for index, node in enumerate(body):
            if index == move:
                continue
            if index == loop.forward:
                out.extend([head[0], *new[1:], head[1]])
            elif index == loop.gate_index and gate_name is not None and isinstance(node, cst.If):
                out.append(node.with_changes(test=expression(gate_name)))
            else:
                out.append(node)
        return out

    return Edit({id(loop.loop): _body_edit(rebuild)})


def _has_zero_grad_after(block: Sequence[cst.BaseStatement], index: int) -> bool:
    return any(is_zero_grad(c) for s in block[index + 1 :] for c in calls_in(s))


def move_zero_grad(loop: AccumLoop, remove: Sequence[int], call_code: str) -> Edit:
    """Drop per-micro-batch ``zero_grad`` calls; make sure one follows the step."""
    need = not _has_zero_grad_after(loop.step_block, loop.step_index)
    drop = set(remove)

    def after_step(block: Statements, at: int) -> Statements:
        if not need:
            return block
        return [*block[: at + 1], statement(call_code), *block[at + 1 :]]

    def rebuild(body: Statements) -> Statements:
        out: Statements = []
        for index, node in enumerate(body):
            if index == loop.gate_index and isinstance(node, cst.If):
                assert isinstance(node.body, cst.IndentedBlock)
                inner = after_step(list(node.body.body), loop.step_index)
                node = node.with_changes(body=node.body.with_changes(body=inner))
            if index == loop.accumulate_index and isinstance(node, cst.With):
                assert isinstance(node.body, cst.IndentedBlock)
                kept = [s for i, s in enumerate(node.body.body) if i not in drop]
                at = loop.step_index - sum(1 for i in drop if i < loop.step_index)
                node = node.with_changes(body=node.body.with_changes(body=after_step(kept, at)))
            elif index in drop and loop.style != "accumulate":
                if index + 1 < len(body) and getattr(node, "leading_lines", None):
                    body[index + 1] = body[index + 1].with_changes(leading_lines=node.leading_lines)  # type: ignore[attr-defined]
                continue
            out.append(node)
        return out

    edit = Edit({id(loop.loop): _body_edit(rebuild)})
    if loop.style == "inner" and need:
        step = loop.step_block[loop.step_index]
        edit.replace[id(step)] = lambda node: cst.FlattenSentinel([node, statement(call_code)])  # type: ignore[list-item]
    return edit


def code_of_statement(node: cst.BaseStatement) -> str:
    return code_of(node.with_changes(leading_lines=())).strip()


def shift_gate(loop: AccumLoop, var: str) -> Edit | None:
    """``i % n == 0`` -> ``(i + 1) % n == 0`` in the step gate (or the name it tests)."""
    gate = loop.gate
    if gate is None:
        return None
    test: cst.CSTNode = gate.test
    if isinstance(gate.test, cst.Name) and gate.test.value in loop.names:
        test = loop.names[gate.test.value]
    pattern = m.BinaryOperation(operator=m.Modulo(), left=m.Name(var))
    found = m.findall(test, pattern)
    if not found:
        return None
    first = found[0]
    assert isinstance(first, cst.BinaryOperation)
    return replace_expression(first.left, f"({var} + 1)")


def replace_expression(target: cst.CSTNode, code: str) -> Edit:
    return Edit({id(target): lambda _node: expression(code)})


def add_keyword(call: cst.Call, keyword: str, value: str) -> Edit:
    def fn(node: cst.CSTNode) -> Replacement:
        assert isinstance(node, cst.Call)
        arg = cst.Arg(
            value=expression(value),
            keyword=cst.Name(keyword),
            equal=cst.AssignEqual(
                whitespace_before=cst.SimpleWhitespace(""),
                whitespace_after=cst.SimpleWhitespace(""),
            ),
        )
        args = list(node.args)
        if args:
            args[-1] = args[-1].with_changes(
                comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            )
        return node.with_changes(args=[*args, arg])

    return Edit({id(call): fn})


def merge(*edits: Edit) -> Edit:
    out = Edit()
    for edit in edits:
        out.replace.update(edit.replace)
        out.imports = (*out.imports, *edit.imports)
    return out
