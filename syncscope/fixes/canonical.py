"""The canonical form for a loop: what ``syncscope fix`` adds where no sync toggle is left.

Raw DDP gets ``with (model.no_sync() if not is_last else contextlib.nullcontext()):`` around
forward and backward (or ``model.require_backward_grad_sync = is_last`` before the forward
where the script uses the flag); FSDP2 gets ``model.set_requires_gradient_sync(is_last)``
before the forward (``set_requires_all_reduce(is_last)`` where a profile saw HSDP). A script that wraps its model only under a condition (``if ddp:``) also
runs unwrapped, so the toggle goes under that condition: ``model.no_sync() if ddp and not
is_last else ...``, ``if ddp: model.require_backward_grad_sync = is_last``; Accelerate gets ``with accelerator.accumulate(model):`` and
``Accelerator(gradient_accumulation_steps=N)``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import libcst as cst
import libcst.matchers as m

from syncscope.fixes import edits
from syncscope.fixes.edits import Edit, Statements
from syncscope.fixes.gates import code_of
from syncscope.fixes.loops import AccumLoop
from syncscope.fixes.resolve import Resolution, WrapperKind
from syncscope.fixes.syntax import assigned_names, calls_in, is_backward, names_in

DdpForm = Literal["no_sync", "flag"]


@dataclass
class Context:
    loop: AccumLoop
    wrapper: WrapperKind | None
    ddp_form: DdpForm
    resolution: Resolution
    module: cst.Module
    why_unresolved: str = ""
    distributed: bool = True  # the file uses torch.distributed or accelerate at all
    # the script's condition for wrapping the model (``ddp``): it also runs unwrapped, so
    # what only a wrapper has (``no_sync``, the flag, the FSDP2 setter) is used under it
    guard: str | None = None
    # the profile (``--from``) saw HSDP: ``set_requires_all_reduce`` skips only the
    # cross-replica all-reduce and keeps gradients sharded (sync-semantics.md)
    hsdp: bool = False
    # the profile saw the model is not an FSDPModule: the setter goes to the FSDP modules
    # inside it (a setter looked up on the model itself raises or does nothing)
    setter_on_modules: bool = False
    # the profile saw DDP(static_graph=True): no rewrite may put its first backward of
    # training under no_sync (torch's reducer fails an internal assert there)
    static_graph: bool = False


class _Names(cst.CSTVisitor):
    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)


# the names of the last module asked about: every loop of a pass asks about the same module,
# and collecting them once per loop made ``fix`` quadratic in the number of loops
_module_names: list[tuple[cst.Module, frozenset[str]]] = []


def _module_names_of(module: cst.Module) -> frozenset[str]:
    if _module_names and _module_names[0][0] is module:
        return _module_names[0][1]
    visitor = _Names()
    module.visit(visitor)
    names = frozenset(visitor.names)
    _module_names[:] = [(module, names)]
    return names


def _fresh_name(module: cst.Module) -> str:
    used = _module_names_of(module)
    for candidate in ("is_last", "is_last_micro_batch", "syncscope_is_last"):
        if candidate not in used:
            return candidate
    return "syncscope_is_last_"


def _increments(statements: Sequence[cst.BaseStatement], name: str) -> int:
    """How many ``name += 1`` lines ``statements`` hold; -1 if ``name`` changes otherwise."""
    count = 0
    for statement in statements:
        if name not in assigned_names(statement):
            continue
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        if (
            isinstance(small, cst.AugAssign)
            and isinstance(small.operator, cst.AddAssign)
            and code_of(small.value) == "1"
        ):
            count += 1
        else:
            return -1
    return count


def is_last_binding(ctx: Context) -> tuple[str, list[str], str | None] | None:
    """(the expression, setup lines, new gate test) to say "last micro-batch" before the
    forward: a name (``is_last``), or ``not accumulating`` for the script's own flag."""
    loop = ctx.loop
    code = loop.is_last_code
    if code is None:
        return None
    gate = loop.gate
    test = loop.last_test
    negated = isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not)
    flag = test.expression if isinstance(test, cst.UnaryOperation) and negated else test
    if gate is not None and isinstance(flag, cst.Name):  # ``if is_last:``, ``if not accumulating:``
        name = flag.value
        bound_before = any(name in assigned_names(s) for s in loop.body[: loop.forward])
        return (f"not {name}" if negated else name, [], None) if bound_before else None
    for statement in loop.body[: loop.forward]:
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        if isinstance(small, cst.Assign) and code_of(small.value) == code:
            target = small.targets[0].target
            if isinstance(target, cst.Name):
                name = target.value
                return name, [], loop.gate_test(name) if gate is not None else None
    if gate is not None and test is not None:
        between = loop.body[loop.forward : loop.gate_index]
        changed = names_in(test) & {n for s in between for n in assigned_names(s)}
        if any(_increments(between, counter) != 1 for counter in changed):
            return None  # the gate's counter changes between forward and gate
        ahead: cst.CSTNode = test
        for counter in changed:  # ``micro += 1`` before the gate: test ``micro + 1`` ahead
            shifted = m.replace(ahead, m.Name(counter), cst.parse_expression(f"({counter} + 1)"))
            assert isinstance(shifted, cst.CSTNode)
            ahead = shifted
        code = code_of(ahead)
    name = _fresh_name(ctx.module)
    return name, [f"{name} = {code}"], loop.gate_test(name) if gate is not None else None


def _accelerator_of(ctx: Context) -> str | None:
    accelerators = ctx.resolution.accelerators
    for statement in ctx.loop.body:
        for call in calls_in(statement):
            if is_backward(call) and isinstance(call.func, cst.Attribute):
                owner = code_of(call.func.value)
                if owner in accelerators:
                    return owner
    return next(iter(accelerators)) if len(accelerators) == 1 else None


def _bound_before(name: str, code: str, position: int) -> bool:
    pattern = rf"^[ \t]*(?:{name}\b[^=\n]*=[^=]|.*\bdef\b.*\b{name}\b|.*\bimport\b.*\b{name}\b)"
    found = re.search(pattern, code, re.M)
    return found is not None and found.start() < position


def accelerate_rewrite(ctx: Context) -> tuple[Edit | None, str]:
    """``with accelerator.accumulate(model):``, training kept as the user had it:
    ``accelerator.backward`` divides by ``gradient_accumulation_steps``, so where the
    keyword is added the loop's own ``/ N`` goes; a loop that does not divide (its
    gradients are sums), or whose N is defined after the ``Accelerator``, gets
    ``accelerator.no_sync(model)`` on every micro-batch but the last instead."""
    loop = ctx.loop
    acc = _accelerator_of(ctx)
    if acc is None:
        return None, "no Accelerator() is constructed in this file"
    if loop.last_gate is None:
        return None, "the step gate is not of a form syncscope can read"
    n = loop.last_gate.pred.n
    call = ctx.resolution.accelerators[acc]
    keywords = {a.keyword.value for a in call.args if a.keyword is not None}
    span = loop.body[loop.forward : loop.backward + 1]
    divides = f"{acc}.backward(" in "".join(code_of(s) for s in span)
    has_steps = "gradient_accumulation_steps" in keywords
    if not has_steps and divides:
        source = ctx.module.code
        position = source.find(code_of(call))
        roots = {r for r in re.findall(r"[A-Za-z_]\w*", n) if r not in {"len", "int"}}
        if not all(_bound_before(r, source, position) for r in roots) or not any(
            _divided_by(s, n) for s in span
        ):
            return no_sync_rewrite(ctx, f"{acc}.no_sync({loop.model})")
    gate = loop.gate_test(f"{acc}.sync_gradients") if loop.gate is not None else None
    header = f"with {acc}.accumulate({loop.model}):"
    if has_steps:  # it divides already: nothing to add, nothing to drop
        return edits.wrap_span(loop, header, [], gate), ""
    rewrite = edits.wrap_span(
        loop, header, [], gate, span_fix=lambda span: _drop_loss_division(span, n)
    )
    return edits.merge(rewrite, edits.add_keyword(call, "gradient_accumulation_steps", n)), ""


def _divided_by(statement: cst.BaseStatement, n: str) -> bool:
    """``loss = <expr> / n``."""
    small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
    value = small.value if isinstance(small, cst.Assign) else None
    return (
        isinstance(value, cst.BinaryOperation)
        and isinstance(value.operator, cst.Divide)
        and code_of(value.right) == n
    )


def _drop_loss_division(span: Statements, n: str) -> Statements:
    """``accelerator.backward`` divides by ``gradient_accumulation_steps``: drop ``/ n``
    (``loss = loss / n`` goes whole)."""
    out: Statements = []
    for statement in span:
        if _divided_by(statement, n):
            assert isinstance(statement, cst.SimpleStatementLine)
            small = statement.body[0]
            assert isinstance(small, cst.Assign) and isinstance(small.value, cst.BinaryOperation)
            value = small.value
            left = value.left.with_changes(lpar=()) if _bare_parens(value.left) else value.left
            if _bare_parens(value.left):
                left = left.with_changes(rpar=())
            if code_of(left) == code_of(small.targets[0].target) and len(small.targets) == 1:
                continue  # ``loss = loss / n``: nothing left of it
            statement = statement.with_changes(body=[small.with_changes(value=left)])
        out.append(statement)
    return out


def _bare_parens(node: cst.BaseExpression) -> bool:
    return bool(node.lpar) and not isinstance(node, (cst.Tuple, cst.GeneratorExp))


def canonical_rewrite(ctx: Context) -> tuple[Edit | None, str]:
    """The form that matches the script, added to a loop that has no sync toggle."""
    if ctx.wrapper == "accelerate":
        return accelerate_rewrite(ctx)
    if ctx.wrapper == "ddp" and ctx.static_graph:
        return None, (
            "DDP(static_graph=True) needs the first backward of training synced; "
            "not rewritten: see the finding's advice (syncscope profile)"
        )
    if ctx.loop.split:
        return None, (
            "the step's if/else runs the backward in both branches, and they differ beyond "
            "a sync toggle: cannot move the sync before the forward"
        )
    binding = is_last_binding(ctx)
    if binding is None:
        return None, "cannot tell, before the forward, whether a micro-batch is the last"
    name, setup, gate = binding
    model = ctx.loop.model
    guard = ctx.guard

    def guarded(code: str) -> str:
        indented = "\n".join("    " + line for line in code.splitlines())
        return f"if {guard}:\n{indented}" if guard else code

    if ctx.wrapper == "fsdp2":
        setter = "set_requires_all_reduce" if ctx.hsdp else "set_requires_gradient_sync"
        call = f"{model}.{setter}({name})"
        if ctx.setter_on_modules:
            call = (
                f"for _fsdp_module in {model}.modules():  # the FSDP modules inside\n"
                f"    if hasattr(_fsdp_module, {setter!r}):\n"
                f"        _fsdp_module.{setter}({name}, recurse=False)"
            )
        lines = [*setup, guarded(call)]
        return edits.insert_before_forward(ctx.loop, lines, None, gate), ""
    if ctx.wrapper == "ddp" and ctx.ddp_form == "flag":
        lines = [*setup, guarded(f"{model}.require_backward_grad_sync = {name}")]
        return edits.insert_before_forward(ctx.loop, lines, None, gate), ""
    return no_sync_rewrite(ctx, f"{model}.no_sync()")


def no_sync_rewrite(ctx: Context, no_sync: str) -> tuple[Edit | None, str]:
    """``with (NO_SYNC if not is_last else contextlib.nullcontext()):`` around the forward
    and the backward."""
    binding = is_last_binding(ctx)
    if binding is None:
        return None, "cannot tell, before the forward, whether a micro-batch is the last"
    name, setup, gate = binding
    skip = name.removeprefix("not ") if name.startswith("not ") else f"not {name}"
    skip = f"{ctx.guard} and {skip}" if ctx.guard else skip
    header = f"with ({no_sync} if {skip} else contextlib.nullcontext()):"
    rewrite = edits.wrap_span(ctx.loop, header, setup, gate)
    rewrite.imports = ("contextlib",)
    return rewrite, ""
