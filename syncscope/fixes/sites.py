"""Accumulation sites ``fix`` does not rewrite, and the code it suggests for them.

A *site* is a ``for``/``while`` loop that runs a backward (itself, or through a function of
the file it calls) and gates the optimizer step: an ``if`` holding the step, or a step after
an inner loop that runs the backward. Every site of a distributed file is either one of the
loops ``loops.find_loops`` describes (rewritten, or refused with its reason) or one it
could not read: those are said, one line each, with the canonical form written in the
script's own names (model, forward, backward, gate, optimizer), so ``fix`` never ends in a
silent 0 on a loop it should have handled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider

from syncscope.fixes.gates import code_of
from syncscope.fixes.loops import inner_last
from syncscope.fixes.resolve import Resolution, WrapperKind
from syncscope.fixes.syntax import (
    calls_in,
    contains,
    dotted,
    is_backward,
    is_step,
    negation,
    stepped_optimizer,
)


@dataclass(frozen=True)
class Site:
    """One accumulation loop, as much of it as can be read without understanding it."""

    line: int
    lines: frozenset[int]
    header: str  # ``for i, (x, y) in enumerate(loader):``
    model: str | None  # a wrapped name the loop calls, or None
    wrapper: WrapperKind | None
    forward: str | None  # the statement that calls the model
    backward: str  # the backward statement
    last: str | None  # an expression true on the window's last micro-batch (the gate's own)
    optimizer: str  # the receiver of the step (``optimizer``, ``self.opt``)
    step: str  # the step statement (``optimizer.step()``, ``scaler.step(optimizer)``)
    through: str | None  # the file's function the backward runs in, if not the loop
    inner: str | None = None  # the header of the inner micro-batch loop, steps outside it
    bypass: str | None = None  # ``model.module(...)``: a forward around the wrapper


class _Sites(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, resolution: Resolution, backward_functions: set[str]) -> None:
        super().__init__()
        self.resolution = resolution
        self.backward_functions = backward_functions
        self.sites: list[Site] = []

    def visit_For(self, node: cst.For) -> None:
        self._loop(node, _header(node))

    def visit_While(self, node: cst.While) -> None:
        self._loop(node, _header(node))

    def _calls_backward(self, call: cst.Call) -> bool:
        name = dotted(call.func) or ""
        return is_backward(call) or name.rsplit(".", 1)[-1] in self.backward_functions

    def _loop(self, node: cst.For | cst.While, header: str) -> None:
        body = node.body.body if isinstance(node.body, cst.IndentedBlock) else ()
        backward = _first_statement(body, self._calls_backward)
        gate = _step_gate(body, backward) if backward is not None else None
        inner = None
        if backward is None:  # steps outside, micro-batches in an inner loop
            loops = [s for s in body if isinstance(s, (cst.For, cst.While))]
            inner = next((s for s in loops if contains(s, self._calls_backward)), None)
            stepped = any(contains(s, is_step) for s in body if s not in loops)
            if inner is None or not stepped or contains(inner, is_step):
                return
            assert isinstance(inner, (cst.For, cst.While))
            inner_body = inner.body.body if isinstance(inner.body, cst.IndentedBlock) else ()
            backward = _first_statement(inner_body, self._calls_backward)
            if backward is None:
                return
            body = [*inner_body, *(s for s in body if s is not inner)]
        elif gate is None:
            return
        step_call = next(c for s in body for c in calls_in(s) if is_step(c))
        model = self._model(body)
        position = self.get_metadata(PositionProvider, node)
        through = None
        call = next(c for c in calls_in(backward) if self._calls_backward(c))
        if not is_backward(call):
            through = dotted(call.func)
        forward = _first_statement(body, lambda c: model is not None and dotted(c.func) == model)
        if through is not None:
            forward = backward  # the call that runs forward and backward
        self.sites.append(
            Site(
                line=position.start.line,
                lines=frozenset(range(position.start.line, position.end.line + 1)),
                header=header,
                model=model,
                wrapper=self.resolution.kind_of(model) if model else None,
                forward=_statement_code(forward) if forward is not None else None,
                backward=_statement_code(backward) if through is None else "",
                last=_last_test(gate) if gate is not None else _inner_test(inner),
                optimizer=stepped_optimizer(step_call) or "optimizer",
                step=code_of(step_call),
                through=through,
                inner=_header(inner) if inner is not None else None,
                bypass=f"{model}.module(...)"
                if model
                and any(dotted(c.func) == f"{model}.module" for s in body for c in calls_in(s))
                else None,
            )
        )

    def _model(self, body: Sequence[cst.BaseStatement]) -> str | None:
        """The wrapped name the loop calls (or passes to a function it calls)."""
        wrapped = [n for n in self.resolution.kinds if self.resolution.kind_of(n) is not None]
        for statement in body:
            for call in calls_in(statement):
                name = dotted(call.func)
                if name in wrapped:
                    return name
                for arg in call.args:
                    if dotted(arg.value) in wrapped:
                        return dotted(arg.value)
        return wrapped[0] if len(wrapped) == 1 else None


Predicate = Callable[[cst.Call], bool]


def _header(node: cst.For | cst.While) -> str:
    if isinstance(node, cst.For):
        return f"for {code_of(node.target)} in {code_of(node.iter)}:"
    return f"while {code_of(node.test)}:"


def _first_statement(
    body: Sequence[cst.BaseStatement], predicate: Predicate
) -> cst.BaseStatement | None:
    """The first statement of ``body`` (nested loops aside) with a call ``predicate`` holds;
    inside an ``if``/``with``, the innermost simple statement that holds it."""
    for statement in body:
        if isinstance(statement, (cst.For, cst.While)):
            continue
        if contains(statement, predicate):
            return _innermost(statement, predicate)
    return None


def _innermost(statement: cst.BaseStatement, predicate: Predicate) -> cst.BaseStatement:
    for line in m.findall(statement, m.SimpleStatementLine()):
        assert isinstance(line, cst.SimpleStatementLine)
        if contains(line, predicate):
            return line
    return statement


def _statement_code(statement: cst.BaseStatement) -> str:
    return code_of(statement.with_changes(leading_lines=())).strip().splitlines()[0]


def _step_gate(
    body: Sequence[cst.BaseStatement], backward: cst.BaseStatement
) -> tuple[cst.If, bool] | None:
    """The ``if``, at or after the backward's statement, whose body (True) or ``else``
    (False) holds the step, or that ``continue``s before it (False: the step runs when its
    test fails). A ``continue`` before the backward skips a micro-batch: no gate."""
    statements = list(body)
    start = next(i for i, s in enumerate(statements) if s is backward or _holds(s, backward))
    for index in range(start, len(statements)):
        statement = statements[index]
        if not isinstance(statement, cst.If):
            continue
        if contains(statement, is_step):
            return statement, contains(statement.body, is_step)
        if m.findall(statement.body, m.Continue()) and any(
            contains(s, is_step) for s in statements[index + 1 :]
        ):
            return statement, False
    return None


def _holds(statement: cst.BaseStatement, inner: cst.BaseStatement) -> bool:
    return any(node is inner for node in m.findall(statement, m.SimpleStatementLine()))


def _inner_test(inner: cst.For | cst.While | None) -> str | None:
    """``micro == N - 1`` for an inner ``for micro in range(N)`` (or ``enumerate``)."""
    follow = inner_last(inner) if inner is not None else None
    return follow[0] if follow is not None else None


def _last_test(gate: tuple[cst.If, bool]) -> str:
    node, in_body = gate
    return code_of(node.test if in_body else negation(node.test))


def _backward_functions(module: cst.Module) -> set[str]:
    """Functions of the file that run a backward (``def micro_step(...): loss.backward()``)."""
    found: set[str] = set()
    for node in m.findall(module, m.FunctionDef()):
        assert isinstance(node, cst.FunctionDef)
        if any(is_backward(c) for c in m.findall(node.body, m.Call()) if isinstance(c, cst.Call)):
            found.add(node.name.value)
    return found


def find_sites(wrapper: MetadataWrapper, resolution: Resolution) -> list[Site]:
    """The accumulation sites of ``wrapper.module``, innermost first where they nest."""
    visitor = _Sites(resolution, _backward_functions(wrapper.module))
    wrapper.visit(visitor)
    sites = visitor.sites
    # a loop around a site (epochs around steps) is no site of its own
    return [s for s in sites if not any(o is not s and o.lines < s.lines for o in sites)]


def suggestion(site: Site, wrapper: WrapperKind | None) -> str:
    """The canonical form of ``site`` in the script's own names, one line per ``\\n``."""
    model = site.model or "model"
    last = site.last or "...  # true on the window's last micro-batch"
    forward = site.forward or f"loss = ...  # the forward: {model}(...)"
    if site.forward is not None and site.forward.startswith(("if ", "for ", "while ", "with ")):
        forward = f"...  # the forward: {model}(...)"
    step = [site.step]
    if "scaler." in site.step:
        step.append(site.step.split(".", 1)[0] + ".update()")
    step.append(f"{site.optimizer}.zero_grad()")
    if wrapper == "accelerate":
        body = [
            f"    with accelerator.accumulate({model}):",
            f"        {forward}",
            "        accelerator.backward(loss)",
            "    if accelerator.sync_gradients:",
        ]
    elif wrapper == "fsdp2":
        body = [
            f"    is_last = {last}",
            f"    {model}.set_requires_gradient_sync(is_last)",
            f"    {forward}",
            f"    {site.backward}",
            "    if is_last:",
        ]
    else:
        body = [
            f"    is_last = {last}",
            f"    with ({model}.no_sync() if not is_last else contextlib.nullcontext()):",
            f"        {forward}",
            f"        {site.backward}",
            "    if is_last:",
        ]
    body = [line for line in body if line.strip()]  # no backward line where a call runs it
    if site.inner is None:
        return "\n".join([site.header, *body, *(f"        {s}" for s in step)])
    inner = [f"    {line}" for line in body[:-1]]  # the step after the inner loop, ungated
    return "\n".join([site.header, f"    {site.inner}", *inner, *(f"    {s}" for s in step)])


def site_message(site: Site) -> str:
    """What ``fix`` saw at the site, in one line."""
    words = {
        "ddp": "a DDP model",
        "fsdp1": "an FSDP model",
        "fsdp2": "an FSDP2 model",
        "accelerate": "an Accelerate model",
    }
    model = f"{words[site.wrapper]} '{site.model}'" if site.wrapper else "a model"
    gate = " (step after an inner loop)"
    if site.last and site.inner is None:
        gate = f" (step when `{site.last}`)"
    return f"accumulation loop over {model}{gate} that syncscope fix does not rewrite"


def site_reason(site: Site) -> str:
    """Why it is not rewritten, and what to do instead."""
    if site.through is not None:
        why = f"its backward runs in {site.through}(), which takes no sync toggle"
    elif site.model is None:
        why = "cannot tell which model it trains"
    elif site.forward is None:
        why = f"the loop never calls '{site.model}' itself"
        if site.bypass:
            why += f" ({site.bypass} bypasses it: `syncscope fix --from RUN` rewrites that)"
    elif site.inner is not None and site.last is None:
        why = (
            f"its inner loop `{site.inner}` has no index that tells the last micro-batch "
            "(enumerate a list of the micro-batches)"
        )
    elif site.wrapper is None:
        why = f"'{site.model}' is not wrapped in this file"
    else:
        why = "its shape is not one syncscope fix rewrites"
    return f"{why}; rewrite it by hand to the form below"
