"""Find the gradient-accumulation loops of a file and describe them as plain data.

A *micro loop* is a ``for``/``while`` whose body runs a forward and a backward. It
accumulates when its optimizer step is gated (``if (i + 1) % accum == 0: opt.step()``, style
``gated``), comes after it (an inner ``for micro in range(accum)`` loop, style ``inner``) or
is inside ``accelerator.accumulate`` (style ``accumulate``). Positions are indices into the
micro loop's body (its *direct statements*), which is what the rewrites work on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider, QualifiedNameProvider

from syncscope.fixes.gates import Gate, Pred, code_of, parse_gate
from syncscope.fixes.resolve import Resolution, WrapperKind
from syncscope.fixes.syntax import (
    accumulate_model,
    calls_in,
    contains,
    is_backward,
    is_step,
    method_name,
    no_sync_item,
    zero_grad_receiver,
)

Style = Literal["gated", "inner", "accumulate"]
ToggleKind = Literal["no_sync", "flag", "setter", "accumulate", "helper"]
Covers = Literal["forward", "backward", "both", "none"]


@dataclass
class Toggle:
    """A place where the script changes sync intent."""

    kind: ToggleKind
    index: int  # direct statement of the micro body that holds it
    node: cst.CSTNode  # the With, the assignment statement or the call statement
    covers: Covers  # for ``with`` forms: which of forward/backward run inside
    sync: Gate | None  # when it lets the gradients sync, if that can be told
    never_syncs: bool = False  # ``set_requires_gradient_sync(False)`` / bare ``no_sync()``
    line: int = 0


@dataclass
class ZeroGrad:
    index: int  # direct statement of the micro body
    receiver: str  # code of what ``zero_grad`` is called on
    line: int = 0


@dataclass
class AccumLoop:
    """One accumulation loop, as the rules and rewrites see it."""

    loop: cst.For | cst.While
    body: Sequence[cst.BaseStatement]  # the micro loop's direct statements
    style: Style
    model: str
    wrapper: WrapperKind | None
    forward: int
    backward: int
    line: int
    gate_index: int | None = None  # style ``gated``: the step ``if`` in ``body``
    step_block: Sequence[cst.BaseStatement] = ()  # statements holding the step
    step_index: int = 0  # index of the step statement within ``step_block``
    is_last_code: str | None = None  # expression true on the window's last micro-batch
    last_gate: Gate | None = None  # canonical form of the step gate
    bases: dict[str, int] = field(default_factory=dict)  # counter value at micro-batch 0
    names: dict[str, cst.BaseExpression] = field(default_factory=dict)
    toggles: list[Toggle] = field(default_factory=list)
    zero_grads: list[ZeroGrad] = field(default_factory=list)
    optimizer: str | None = None  # receiver of the step call
    accumulate_index: int | None = None  # style ``accumulate``: the ``with`` in ``body``
    lines: frozenset[int] = frozenset()

    @property
    def gate(self) -> cst.If | None:
        if self.gate_index is None:
            return None
        node = self.body[self.gate_index]
        return node if isinstance(node, cst.If) else None


def _loop_bases(loop: cst.For | cst.While, int_assigns: dict[str, int]) -> dict[str, int]:
    """Counter values at the first micro-batch: loop indices and ``+= 1`` counters."""
    bases: dict[str, int] = {}
    if isinstance(loop, cst.For) and isinstance(loop.iter, cst.Call):
        func = loop.iter.func
        args = loop.iter.args
        target = loop.target
        if isinstance(func, cst.Name) and func.value == "enumerate" and args:
            start = 0
            if len(args) > 1 and isinstance(args[1].value, cst.Integer):
                start = int(args[1].value.value)
            if isinstance(target, cst.Tuple) and target.elements:
                first = target.elements[0].value
                if isinstance(first, cst.Name):
                    bases[first.value] = start
        elif isinstance(func, cst.Name) and func.value == "range" and isinstance(target, cst.Name):
            if len(args) == 1:
                bases[target.value] = 0
            elif isinstance(args[0].value, cst.Integer):
                bases[target.value] = int(args[0].value.value)
    body = loop.body.body if isinstance(loop.body, cst.IndentedBlock) else ()
    for statement in body:
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        if (
            isinstance(small, cst.AugAssign)
            and isinstance(small.operator, cst.AddAssign)
            and isinstance(small.target, cst.Name)
            and code_of(small.value) == "1"
            and small.target.value in int_assigns
        ):
            bases[small.target.value] = int_assigns[small.target.value]
    return bases


def _counter_bases_at(loop: AccumLoop, gate_index: int) -> None:
    """A ``+= 1`` counter incremented before the gate is one ahead when the gate runs."""
    for index, statement in enumerate(loop.body[:gate_index]):
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        if isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name):
            name = small.target.value
            if name in loop.bases and index < gate_index:
                loop.bases[name] += 1


def _local_names(body: Sequence[cst.BaseStatement]) -> dict[str, cst.BaseExpression]:
    names: dict[str, cst.BaseExpression] = {}
    for statement in body:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if (
                    isinstance(small, cst.Assign)
                    and len(small.targets) == 1
                    and isinstance(small.targets[0].target, cst.Name)
                ):
                    names[small.targets[0].target.value] = small.value
    return names


class _Names(cst.CSTVisitor):
    """Pre-pass: functions and classes (never the model), integer counters' first values."""

    def __init__(self) -> None:
        super().__init__()
        self.int_assigns: dict[str, int] = {}
        self.defined: set[str] = set()
        # functions that return a wrapper's ``no_sync()`` (stylegan2's ``ddp_sync(module,
        # sync)``): a ``with`` of their call is a sync toggle whose gate is in their body
        self.sync_helpers: set[str] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.defined.add(node.name.value)
        if contains(node.body, lambda c: method_name(c) == "no_sync"):
            self.sync_helpers.add(node.name.value)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.defined.add(node.name.value)

    def visit_Assign(self, node: cst.Assign) -> None:
        target = node.targets[0].target
        if isinstance(target, cst.Name) and isinstance(node.value, cst.Integer):
            self.int_assigns.setdefault(target.value, int(node.value.value))


class _Finder(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider)

    def __init__(self, resolution: Resolution, names: _Names, helper_codes: frozenset[str]) -> None:
        super().__init__()
        self.resolution = resolution
        self.helper_codes = helper_codes
        self.loops: list[AccumLoop] = []
        self.int_assigns = names.int_assigns
        self.defined = names.defined
        self.sync_helpers = names.sync_helpers

    def visit_Module(self, node: cst.Module) -> None:
        self._scan(node.body)

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._scan(node.body)

    def _line(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    def _lines(self, node: cst.CSTNode) -> frozenset[int]:
        position = self.get_metadata(PositionProvider, node)
        return frozenset(range(position.start.line, position.end.line + 1))

    def _scan(self, block: Sequence[cst.BaseStatement]) -> None:
        for index, statement in enumerate(block):
            if isinstance(statement, (cst.For, cst.While)):
                found = self._analyze(statement, block[index + 1 :])
                if found is not None:
                    self.loops.append(found)

    def _model_of(self, body: Sequence[cst.BaseStatement]) -> str | None:
        names: list[str] = []
        for statement in body:
            for call in calls_in(statement):
                func = call.func
                if isinstance(func, cst.Name) and func.value not in self.defined:
                    if self.get_metadata(QualifiedNameProvider, func, set()):
                        imported = any(
                            q.source.name == "IMPORT"
                            for q in self.get_metadata(QualifiedNameProvider, func, set())
                        )
                        if imported:
                            continue
                    names.append(func.value)
        for name in names:
            if self.resolution.kind_of(name) is not None or name in self.resolution.kinds:
                return name
        for name in names:
            if any(word in name.lower() for word in ("model", "net", "ddp", "fsdp")):
                return name
        return None

    def _analyze(
        self, loop: cst.For | cst.While, after: Sequence[cst.BaseStatement]
    ) -> AccumLoop | None:
        if not isinstance(loop.body, cst.IndentedBlock):
            return None
        body = loop.body.body
        nested = [isinstance(s, (cst.For, cst.While)) for s in body]
        backward = next(
            (i for i, s in enumerate(body) if not nested[i] and contains(s, is_backward)), None
        )
        if backward is None:
            return None
        model = self._model_of(body[: backward + 1])
        if model is None:
            return None
        forward = next(
            i for i, s in enumerate(body) if contains(s, lambda c: _calls_name(c, model))
        )
        step = next((i for i, s in enumerate(body) if not nested[i] and contains(s, is_step)), None)
        accum = AccumLoop(
            loop=loop,
            body=body,
            style="gated",
            model=model,
            wrapper=self.resolution.kind_of(model),
            forward=forward,
            backward=backward,
            line=self._line(loop),
            names=_local_names(body),
            bases=_loop_bases(loop, self.int_assigns),
            lines=self._lines(loop),
        )
        self._find_toggles(accum)
        if step is not None and isinstance(body[step], cst.If) and step > backward:
            accum.gate_index = step
            gate = body[step]
            assert isinstance(gate, cst.If)
            accum.step_block = gate.body.body if isinstance(gate.body, cst.IndentedBlock) else ()
            accum.is_last_code = code_of(gate.test)
            _counter_bases_at(accum, step)
            accum.last_gate = parse_gate(gate.test, accum.names)
        elif step is not None and any(
            t.kind == "accumulate" and t.index == step and isinstance(body[step], cst.With)
            for t in accum.toggles
        ):
            accum.style = "accumulate"
            accum.accumulate_index = step
            block = body[step]
            assert isinstance(block, cst.With) and isinstance(block.body, cst.IndentedBlock)
            accum.step_block = block.body.body
        elif step is None and (follow := _inner_last(loop)) is not None:
            if not any(contains(s, is_step) for s in after):
                return None
            accum.style = "inner"
            accum.is_last_code, accum.last_gate = follow
            accum.bases.setdefault(follow[1].pred.var, 0)
            accum.step_block = after
        else:
            return None
        accum.step_index = next(
            (i for i, s in enumerate(accum.step_block) if contains(s, is_step)), 0
        )
        step_call = next(
            (c for s in accum.step_block for c in calls_in(s) if is_step(c)),
            None,
        )
        if step_call is not None and isinstance(step_call.func, cst.Attribute):
            receiver = code_of(step_call.func.value)
            if "scaler" in receiver and step_call.args:
                receiver = code_of(step_call.args[0].value)
            accum.optimizer = receiver
        for index, statement in enumerate(
            accum.step_block if accum.style == "accumulate" else body
        ):
            zeroed = zero_grad_receiver(statement)
            if zeroed is not None:
                accum.zero_grads.append(ZeroGrad(index, zeroed, self._line(statement)))
        return accum

    def _calls_sync_helper(self, item: cst.BaseExpression) -> bool:
        return (
            isinstance(item, cst.Call)
            and isinstance(item.func, cst.Name)
            and item.func.value in self.sync_helpers
        )

    def _find_toggles(self, accum: AccumLoop) -> None:
        model = accum.model
        for index, statement in enumerate(accum.body):
            line = self._line(statement)
            flag = _flag_value(statement)
            if flag is not None:
                gate = parse_gate(flag, accum.names)
                accum.toggles.append(Toggle("flag", index, statement, "none", gate, line=line))
                continue
            value = _setter_value(statement)
            if value is not None:
                gate = parse_gate(value, accum.names)
                never = isinstance(value, cst.Name) and value.value == "False"
                accum.toggles.append(
                    Toggle("setter", index, statement, "none", gate, never_syncs=never, line=line)
                )
                continue
            for with_node, sync in _withs(statement, accum.names):
                item = with_node.items[0].item
                kind: ToggleKind = "accumulate" if accumulate_model(item) else "no_sync"
                no_sync = no_sync_item(item, accum.names)
                if kind == "no_sync" and no_sync is None:
                    if self._calls_sync_helper(item):
                        covers = _covers(with_node, model)
                        accum.toggles.append(
                            Toggle("helper", index, with_node, covers, None, line=line)
                        )
                    continue
                covers = _covers(with_node, model)
                never = no_sync is not None and not no_sync.conditional and statement is with_node
                accum.toggles.append(
                    Toggle(kind, index, with_node, covers, sync, never_syncs=never, line=line)
                )
            text = code_of(statement.with_changes(leading_lines=())).strip()
            known = any(t.index == index for t in accum.toggles)
            compute = index in (accum.forward, accum.backward)
            if text in self.helper_codes and not known and not compute:
                accum.toggles.append(Toggle("helper", index, statement, "none", None, line=line))


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


def _flag_value(statement: cst.BaseStatement) -> cst.BaseExpression | None:
    """``model.require_backward_grad_sync = value`` -> value."""
    for small in _simple_statements(statement):
        if (
            isinstance(small, cst.Assign)
            and isinstance(small.targets[0].target, cst.Attribute)
            and small.targets[0].target.attr.value == "require_backward_grad_sync"
        ):
            return small.value
    return None


def _setter_value(statement: cst.BaseStatement) -> cst.BaseExpression | None:
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


def _calls_name(call: cst.Call, name: str) -> bool:
    return isinstance(call.func, cst.Name) and call.func.value == name


def _covers(with_node: cst.With, model: str) -> Covers:
    forward = contains(with_node, lambda c: _calls_name(c, model))
    backward = contains(with_node, is_backward)
    if forward and backward:
        return "both"
    return "forward" if forward else "backward" if backward else "none"


def _withs(
    statement: cst.BaseStatement, names: dict[str, cst.BaseExpression]
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
    statement: cst.Match, names: dict[str, cst.BaseExpression]
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


def _inner_last(loop: cst.For | cst.While) -> tuple[str, Gate] | None:
    """``for micro in range(n)`` -> (``"micro == n - 1"``, its canonical gate)."""
    if not isinstance(loop, cst.For) or not isinstance(loop.iter, cst.Call):
        return None
    func, args, target = loop.iter.func, loop.iter.args, loop.target
    if not isinstance(func, cst.Name) or not args:
        return None
    if func.value == "range" and len(args) == 1 and isinstance(target, cst.Name):
        var, n = target.value, code_of(args[0].value)
    elif func.value == "enumerate" and isinstance(target, cst.Tuple) and len(args) == 1:
        first = target.elements[0].value
        if not isinstance(first, cst.Name):
            return None
        var, n = first.value, f"len({code_of(args[0].value)})"
    else:
        return None
    wrapped = f"({n})" if any(ch in n for ch in " +-*/%") else n
    return f"{var} == {wrapped} - 1", Gate(Pred(var, "last", 1, n), True)


def find_loops(
    wrapper: MetadataWrapper, resolution: Resolution, helper_codes: frozenset[str] = frozenset()
) -> list[AccumLoop]:
    """Accumulation loops of ``wrapper.module``; ``helper_codes`` are statements (as text)
    that toggle sync through a helper, known from a profile (``--from``)."""
    names = _Names()
    wrapper.module.visit(names)
    finder = _Finder(resolution, names, helper_codes)
    wrapper.visit(finder)
    return finder.loops
