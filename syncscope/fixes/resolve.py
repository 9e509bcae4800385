"""Which wrapper does a name hold? Resolved through the imports and assignments of one file.

Resolution is by name across the whole file (scripts, not libraries): every assignment of a
wrapper constructor to a name counts. A name bound to exactly one wrapper kind is resolved;
one bound to several (``FSDP(m) if fsdp else DDP(m)``) or to none (built in another file) is
not, and the reason says which.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, QualifiedNameProvider

from syncscope.fixes.syntax import dotted

WrapperKind = Literal["ddp", "fsdp1", "fsdp2", "accelerate"]

WRAPPER_WORDS: dict[WrapperKind, str] = {
    "ddp": "DistributedDataParallel",
    "fsdp1": "FSDP (FullyShardedDataParallel)",
    "fsdp2": "FSDP2 (fully_shard)",
    "accelerate": "an Accelerate-prepared model",
}

DDP_NAMES = frozenset(
    {
        "torch.nn.parallel.DistributedDataParallel",
        "torch.nn.parallel.distributed.DistributedDataParallel",
    }
)
FSDP1_NAMES = frozenset(
    {
        "torch.distributed.fsdp.FullyShardedDataParallel",
        "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
    }
)
FSDP2_NAMES = frozenset(
    {
        "torch.distributed.fsdp.fully_shard",
        "torch.distributed._composable.fsdp.fully_shard",
        "torch.distributed._composable.fsdp.fully_shard.fully_shard",
    }
)
ACCELERATOR_NAMES = frozenset({"accelerate.Accelerator", "accelerate.accelerator.Accelerator"})
PASS_THROUGH_NAMES = frozenset({"torch.compile"})


@dataclass
class Resolution:
    """Wrapper kinds bound to each name, and the ``Accelerator(...)`` constructions."""

    kinds: dict[str, set[WrapperKind]] = field(default_factory=dict)
    accelerators: dict[str, cst.Call] = field(default_factory=dict)
    # per name: the condition each wrapper binding runs under (None: unconditionally), and
    # the wrapper constructor's code (``DDP``) for an ``isinstance`` test
    guards: dict[str, set[str | None]] = field(default_factory=dict)
    constructors: dict[str, set[str]] = field(default_factory=dict)

    def kind_of(self, name: str) -> WrapperKind | None:
        kinds = self.kinds.get(name, set())
        return next(iter(kinds)) if len(kinds) == 1 else None

    def guard_of(self, name: str) -> str | None:
        """The script's own condition for wrapping ``name`` (``ddp``, ``world_size > 1``),
        when every wrapping of it has that one condition: the script also runs unwrapped."""
        guards = self.guards.get(name, set())
        return next(iter(guards)) if len(guards) == 1 else None

    def constructor_of(self, name: str) -> str | None:
        constructors = self.constructors.get(name, set())
        return next(iter(constructors)) if len(constructors) == 1 else None

    def why_unresolved(self, name: str) -> str:
        kinds = self.kinds.get(name, set())
        if len(kinds) > 1:
            words = " or ".join(sorted(WRAPPER_WORDS[k] for k in kinds))
            return f"'{name}' is bound to {words} depending on the run"
        return (
            f"'{name}' is not wrapped in this file (DDP, FSDP or Accelerate is decided elsewhere)"
        )

    def bind(self, name: str, kind: WrapperKind) -> None:
        self.kinds.setdefault(name, set()).add(kind)


def _target_names(target: cst.BaseExpression) -> list[str | None]:
    """Names bound by an assignment target, positionally (``None`` for non-names)."""
    if isinstance(target, (cst.Name, cst.Attribute)):
        return [dotted(target)]  # ``self.model = DDP(...)``: the attribute, by its code
    if isinstance(target, (cst.Tuple, cst.List)):
        return [dotted(element.value) for element in target.elements]
    return [None]


_SIMPLE = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Comparison, cst.UnaryOperation)


def _condition(node: cst.BaseExpression, negate: bool = False) -> str:
    """``node`` as a term of an ``and`` chain (parenthesized where needed), or its negation."""
    code = cst.Module(body=[]).code_for_node(node.with_changes(lpar=(), rpar=()))
    if negate:
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
            return _condition(node.expression)
        return f"not {code}" if isinstance(node, _SIMPLE) else f"not ({code})"
    return code if isinstance(node, _SIMPLE) else f"({code})"


class _Resolver(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (QualifiedNameProvider, ParentNodeProvider)

    def __init__(self) -> None:
        super().__init__()
        self.result = Resolution()
        self.guards = self.result.guards

    def _qualified(self, node: cst.CSTNode) -> set[str]:
        names = self.get_metadata(QualifiedNameProvider, node, set())
        return {q.name for q in names}

    def _guard(self, node: cst.CSTNode, extra: str | None = None) -> str | None:
        """The ``if`` conditions ``node`` runs under (``elif``/``else``: the earlier tests
        negated), joined with ``and``; None when it runs unconditionally."""
        terms: list[str] = [extra] if extra else []
        child: cst.CSTNode = node
        parent = self.get_metadata(ParentNodeProvider, node, None)
        while parent is not None:
            if isinstance(parent, cst.If):
                if child is parent.body:
                    terms.append(_condition(parent.test))
                elif child is parent.orelse:
                    terms.append(_condition(parent.test, negate=True))
            child = parent
            parent = self.get_metadata(ParentNodeProvider, parent, None)
        return " and ".join(reversed(terms)) or None

    def _constructor(self, value: cst.BaseExpression) -> str | None:
        """Code of the DDP constructor ``value`` calls (``DDP``), for ``isinstance``."""
        if isinstance(value, cst.IfExp):
            return self._constructor(value.body) or self._constructor(value.orelse)
        if isinstance(value, cst.Call) and self._qualified(value.func) & DDP_NAMES:
            return cst.Module(body=[]).code_for_node(value.func)
        return None

    def _bind_guarded(
        self, name: str, kinds: set[WrapperKind], node: cst.CSTNode, value: cst.BaseExpression
    ) -> None:
        extra = None
        if isinstance(value, cst.IfExp):  # ``DDP(m) if ddp else m``
            body, orelse = self._kinds_of_value(value.body), self._kinds_of_value(value.orelse)
            if body and not orelse:
                extra = _condition(value.test)
            elif orelse and not body:
                extra = _condition(value.test, negate=True)
        self.guards.setdefault(name, set()).add(self._guard(node, extra))
        constructor = self._constructor(value)
        if constructor is not None:
            self.result.constructors.setdefault(name, set()).add(constructor)
        for kind in kinds:
            self.result.bind(name, kind)

    def _kinds_of_value(self, value: cst.BaseExpression) -> set[WrapperKind]:
        """Wrapper kinds an expression can evaluate to."""
        if isinstance(value, cst.IfExp):
            return self._kinds_of_value(value.body) | self._kinds_of_value(value.orelse)
        if isinstance(value, (cst.Name, cst.Attribute)):
            return set(self.result.kinds.get(dotted(value) or "", set()))
        if not isinstance(value, cst.Call):
            return set()
        names = self._qualified(value.func)
        if names & DDP_NAMES:
            return {"ddp"}
        if names & FSDP1_NAMES:
            return {"fsdp1"}
        if names & FSDP2_NAMES:
            return {"fsdp2"}
        if names & PASS_THROUGH_NAMES and value.args:
            return self._kinds_of_value(value.args[0].value)
        return set()

    def _is_accelerator_method(self, value: cst.BaseExpression, methods: set[str]) -> bool:
        return (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and dotted(value.func.value) in self.result.accelerators
            and value.func.attr.value in methods
        )

    def _assign(
        self,
        targets: Sequence[cst.BaseExpression],
        value: cst.BaseExpression,
        statement: cst.CSTNode,
    ) -> None:
        for target in targets:
            names = _target_names(target)
            if isinstance(value, cst.Call) and self._qualified(value.func) & ACCELERATOR_NAMES:
                for name in names:
                    if name is not None:
                        self.result.accelerators[name] = value
                continue
            if self._is_accelerator_method(value, {"prepare", "prepare_model"}):
                for name in names:
                    if name is not None:
                        self.result.bind(name, "accelerate")
                continue
            kinds = self._kinds_of_value(value)
            if len(names) == 1 and names[0] is not None and kinds:
                self._bind_guarded(names[0], kinds, statement, value)

    def visit_Assign(self, node: cst.Assign) -> None:
        self._assign([t.target for t in node.targets], node.value, node)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._assign([node.target], node.value, node)

    def visit_Call(self, node: cst.Call) -> None:
        # ``fully_shard(model)`` wraps in place: the argument's name now holds FSDP2.
        if self._qualified(node.func) & FSDP2_NAMES and node.args:
            first = dotted(node.args[0].value)
            if first is not None:
                self._bind_guarded(first, {"fsdp2"}, node, node)


def resolve_wrappers(wrapper: MetadataWrapper) -> Resolution:
    """Resolve the wrappers bound to names in ``wrapper.module``."""
    resolver = _Resolver()
    wrapper.visit(resolver)
    return resolver.result


def _bound_by(node: cst.CSTNode) -> set[str]:
    """Names a module-level statement binds (assignments, imports, defs, loop targets)."""
    names: set[str] = set()
    if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
        return {node.name.value}
    if isinstance(node, (cst.Import, cst.ImportFrom)) and not isinstance(
        node.names, cst.ImportStar
    ):
        for alias in node.names:
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                names.add(alias.asname.name.value)
            else:
                names.add(cst.Module(body=[]).code_for_node(alias.name).split(".")[0])
        return names
    targets: list[cst.BaseExpression] = []
    if isinstance(node, cst.Assign):
        targets = [t.target for t in node.targets]
    elif isinstance(node, (cst.AnnAssign, cst.AugAssign, cst.For)):
        targets = [node.target]
    elif isinstance(node, cst.WithItem) and node.asname is not None:
        targets = [node.asname.name]
    for target in targets:
        names |= {n for n in _target_names(target) if n is not None}
    return names


def module_level_names(module: cst.Module) -> set[str]:
    """Names bound at module level, through ``if``/``for``/``with``/``try`` but not inside a
    function or class body: what code anywhere in the file can read."""
    names: set[str] = set()

    def walk(node: cst.CSTNode) -> None:
        names.update(_bound_by(node))
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return
        for child in node.children:
            walk(child)

    walk(module)
    return names


def _read_names(expression: cst.BaseExpression) -> set[str]:
    """Root names an expression reads (``dist`` of ``dist.is_initialized()``)."""
    names: set[str] = set()

    def walk(node: cst.CSTNode) -> None:
        if isinstance(node, cst.Name):
            names.add(node.value)
        elif isinstance(node, cst.Attribute):
            walk(node.value)
        else:
            for child in node.children:
                walk(child)

    walk(expression)
    return names


def usable_guard(resolution: Resolution, model: str, module: cst.Module) -> str | None:
    """How the fixed loop tells "wrapped" from "not wrapped", in the script's own terms.

    The condition the script wraps ``model`` under (``ddp``, ``world_size > 1``,
    ``dist.is_initialized()``) when every name it reads is bound at module level (so the
    loop can read it wherever it is); else ``isinstance(model, DDP)`` with the script's own
    DDP name; None when the wrapping is unconditional (or neither can be written).
    """
    import builtins

    guard = resolution.guard_of(model)
    if guard is None:
        return None
    visible = module_level_names(module) | set(dir(builtins))
    try:
        if _read_names(cst.parse_expression(guard)) <= visible:
            return guard
    except cst.ParserSyntaxError:
        pass
    constructor = resolution.constructor_of(model)
    if constructor is not None and _read_names(cst.parse_expression(constructor)) <= visible:
        return f"isinstance({model}, {constructor})"
    return None
