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
    dotted,
    is_backward,
    is_step,
    method_name,
    negation,
    no_sync_item,
    stepped_optimizer,
    zero_grad_receiver,
)
from syncscope.fixes.toggles import Covers, covers, flag_value, setter_value, withs

# ``helper``: a function (not a loop) that runs a micro-batch's backward under a sync toggle
# its caller chose (``def micro_step(model, x, sync): ... with ctx: loss.backward()``)
Style = Literal["gated", "inner", "accumulate", "helper"]
# where the step runs, relative to the gate ``if``: in its body, in its ``else``, or after it
# (``if micro % accum != 0: continue``)
GateKind = Literal["if", "else", "continue"]
ToggleKind = Literal["no_sync", "flag", "setter", "accumulate", "helper"]


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

    loop: cst.For | cst.While | cst.FunctionDef  # a function for style ``helper``
    body: Sequence[cst.BaseStatement]  # the micro loop's direct statements
    style: Style
    model: str
    wrapper: WrapperKind | None
    forward: int
    backward: int
    line: int
    gate_index: int | None = None  # style ``gated``: the step ``if`` in ``body``
    gate_kind: GateKind = "if"
    split: bool = False  # the gate ``if`` holds the backward too (if/else gate)
    last_test: cst.BaseExpression | None = None  # the gate's test, true on the last micro-batch
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

    def gate_test(self, name: str) -> str:
        """The gate's new test when ``name`` holds "last micro-batch"."""
        return name if self.gate_kind == "if" else f"not {name}"


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
        # functions of the file that enter or return ``no_sync()`` (stylegan2's ``ddp_sync``)
        self.no_sync_helpers: set[str] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.defined.add(node.name.value)
        if contains(node.body, lambda c: method_name(c) == "no_sync"):
            self.no_sync_helpers.add(node.name.value)  # used in a ``with``: a sync toggle

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
        self.no_sync_helpers = names.no_sync_helpers

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        found = self._helper(node)
        if found is not None:
            self.loops.append(found)

    def _helper(self, function: cst.FunctionDef) -> AccumLoop | None:
        """A function that runs one micro-batch's forward and backward under a sync toggle
        it does not decide (the caller passes the flag): style ``helper``, no gate."""
        if not isinstance(function.body, cst.IndentedBlock):
            return None
        body = function.body.body
        backward = next(
            (
                i
                for i, s in enumerate(body)
                if not isinstance(s, (cst.For, cst.While)) and contains(s, is_backward)
            ),
            None,
        )
        if backward is None:
            return None
        model = self._model_of(body[: backward + 1])
        if model is None:
            return None
        forward = next(
            i for i, s in enumerate(body) if contains(s, lambda c: _calls_name(c, model))
        )
        accum = AccumLoop(
            loop=function,
            body=body,
            style="helper",
            model=model,
            wrapper=self.resolution.kind_of(model),
            forward=forward,
            backward=backward,
            line=self._line(function),
            names=_local_names(body),
            lines=self._lines(function),
        )
        self._find_toggles(accum)
        if not any(t.kind in ("no_sync", "flag", "setter") for t in accum.toggles):
            return None
        return accum

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
        """The model the loop calls: a name or ``self.model``, resolved to a wrapper or named
        like one; never an imported function or one defined in the file."""
        names: list[str] = []
        for statement in body:
            for call in calls_in(statement):
                func = call.func
                name = dotted(func)
                if name is None or name in self.defined:
                    continue
                if isinstance(func, cst.Name):
                    qualified = self.get_metadata(QualifiedNameProvider, func, set())
                    if any(q.source.name == "IMPORT" for q in qualified):
                        continue
                names.append(name)
        for name in names:
            if self.resolution.kind_of(name) is not None or name in self.resolution.kinds:
                return name
        for name in names:
            last = name.rsplit(".", 1)[-1].lower()
            if any(word in last for word in ("model", "net", "ddp", "fsdp")):
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
        gate = _step_gate(body, backward, step)
        if gate is not None:
            index, kind, block = gate
            node = body[index]
            assert isinstance(node, cst.If)
            accum.gate_index, accum.gate_kind, accum.step_block = index, kind, block
            accum.split = index == backward
            accum.last_test = node.test if kind == "if" else negation(node.test)
            accum.is_last_code = code_of(accum.last_test)
            _counter_bases_at(accum, index)
            accum.last_gate = parse_gate(accum.last_test, accum.names)
        elif step is not None and any(
            t.kind == "accumulate" and t.index == step and isinstance(body[step], cst.With)
            for t in accum.toggles
        ):
            accum.style = "accumulate"
            accum.accumulate_index = step
            with_node = body[step]
            assert isinstance(with_node, cst.With)
            assert isinstance(with_node.body, cst.IndentedBlock)
            accum.step_block = with_node.body.body
        elif step is None and (follow := inner_last(loop)) is not None:
            if not any(contains(s, is_step) for s in after):
                return None
            accum.style = "inner"
            accum.is_last_code, accum.last_gate = follow
            accum.bases.setdefault(follow[1].pred.var, 0)
            accum.step_block = after
        else:
            return None
        self._step_and_resets(accum)
        return accum

    def _step_and_resets(self, accum: AccumLoop) -> None:
        """The step's place and optimizer, and the ``zero_grad`` calls of every micro-batch."""
        accum.step_index = next(
            (i for i, s in enumerate(accum.step_block) if contains(s, is_step)), 0
        )
        step_call = next(
            (c for s in accum.step_block for c in calls_in(s) if is_step(c)),
            None,
        )
        if step_call is not None:
            accum.optimizer = stepped_optimizer(step_call)
        per_micro_batch = accum.body
        if accum.gate_kind == "continue" and accum.gate_index is not None:
            per_micro_batch = accum.body[: accum.gate_index]  # what follows: at the step only
        for index, statement in enumerate(
            accum.step_block if accum.style == "accumulate" else per_micro_batch
        ):
            zeroed = zero_grad_receiver(statement)
            if zeroed is not None:
                accum.zero_grads.append(ZeroGrad(index, zeroed, self._line(statement)))

    def _find_toggles(self, accum: AccumLoop) -> None:
        model = accum.model
        for index, statement in enumerate(accum.body):
            line = self._line(statement)
            flag = flag_value(statement)
            if flag is not None:
                gate = parse_gate(flag, accum.names)
                accum.toggles.append(Toggle("flag", index, statement, "none", gate, line=line))
                continue
            value = setter_value(statement)
            if value is not None:
                gate = parse_gate(value, accum.names)
                never = isinstance(value, cst.Name) and value.value == "False"
                accum.toggles.append(
                    Toggle("setter", index, statement, "none", gate, never_syncs=never, line=line)
                )
                continue
            for with_node, sync in withs(statement, accum.names):
                item = with_node.items[0].item
                kind: ToggleKind = "accumulate" if accumulate_model(item) else "no_sync"
                no_sync = no_sync_item(item, accum.names)
                helper = isinstance(item, cst.Call) and dotted(item.func) in self.no_sync_helpers
                if kind == "no_sync" and no_sync is None and not helper:
                    continue
                span = covers(with_node, model)
                never = no_sync is not None and not no_sync.conditional and statement is with_node
                at = self._line(with_node)  # the ``with`` itself, in an ``if`` branch too
                accum.toggles.append(
                    Toggle(kind, index, with_node, span, sync, never_syncs=never, line=at)
                )
            text = code_of(statement.with_changes(leading_lines=())).strip()
            known = any(t.index == index for t in accum.toggles)
            compute = index in (accum.forward, accum.backward)
            if text in self.helper_codes and not known and not compute:
                accum.toggles.append(Toggle("helper", index, statement, "none", None, line=line))


def _calls_name(call: cst.Call, name: str) -> bool:
    return dotted(call.func) == name


def _suite(node: cst.BaseSuite | None) -> Sequence[cst.BaseStatement]:
    return node.body if isinstance(node, cst.IndentedBlock) else ()


def is_continue_gate(statement: cst.BaseStatement) -> bool:
    """``if test: ... continue`` (no ``else``): what follows it runs when ``test`` fails."""
    if not isinstance(statement, cst.If) or statement.orelse is not None:
        return False
    body = _suite(statement.body)
    return (
        bool(body)
        and isinstance(body[-1], cst.SimpleStatementLine)
        and isinstance(body[-1].body[-1], cst.Continue)
    )


def _step_gate(
    body: Sequence[cst.BaseStatement], backward: int, step: int | None
) -> tuple[int, GateKind, Sequence[cst.BaseStatement]] | None:
    """The ``if`` that gates the optimizer step: (its index, where the step runs, the
    statements holding the step). Three spellings: ``if gate: step`` after the backward
    (the step in its body or its ``else``); an if/else whose branches both run the backward
    and one of them the step; ``if not gate: continue`` between the backward and the step."""
    if step is None or step < backward:
        return None
    node = body[step]
    if isinstance(node, cst.If):
        orelse = node.orelse.body if isinstance(node.orelse, cst.Else) else None
        in_body = any(contains(s, is_step) for s in _suite(node.body))
        kind: GateKind = "if" if in_body else "else"
        block = _suite(node.body) if in_body else _suite(orelse)
        if step > backward:
            return step, kind, block
        other = _suite(orelse) if in_body else _suite(node.body)
        if orelse is not None and any(contains(s, is_backward) for s in other):
            return step, kind, block  # an if/else gate: both branches run the backward
        return None
    for index in range(backward, step):  # at the backward: ``if not last: backward; continue``
        if is_continue_gate(body[index]):
            return index, "continue", body[index + 1 :]
    return None


def inner_last(loop: cst.For | cst.While) -> tuple[str, Gate] | None:
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
        if not isinstance(first, cst.Name) or dotted(args[0].value) is None:
            return None  # ``len(zip(...))`` would raise: only a named sequence has a length
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
