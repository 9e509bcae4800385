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
from libcst.metadata import MetadataWrapper, QualifiedNameProvider

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

    def kind_of(self, name: str) -> WrapperKind | None:
        kinds = self.kinds.get(name, set())
        return next(iter(kinds)) if len(kinds) == 1 else None

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
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        names: list[str | None] = []
        for element in target.elements:
            value = element.value
            names.append(value.value if isinstance(value, cst.Name) else None)
        return names
    return [None]


class _Resolver(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (QualifiedNameProvider,)

    def __init__(self) -> None:
        super().__init__()
        self.result = Resolution()

    def _qualified(self, node: cst.CSTNode) -> set[str]:
        names = self.get_metadata(QualifiedNameProvider, node, set())
        return {q.name for q in names}

    def _kinds_of_value(self, value: cst.BaseExpression) -> set[WrapperKind]:
        """Wrapper kinds an expression can evaluate to."""
        if isinstance(value, cst.IfExp):
            return self._kinds_of_value(value.body) | self._kinds_of_value(value.orelse)
        if isinstance(value, cst.Name):
            return set(self.result.kinds.get(value.value, set()))
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
            and isinstance(value.func.value, cst.Name)
            and value.func.value.value in self.result.accelerators
            and value.func.attr.value in methods
        )

    def _assign(self, targets: Sequence[cst.BaseExpression], value: cst.BaseExpression) -> None:
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
            if len(names) == 1 and names[0] is not None:
                for kind in kinds:
                    self.result.bind(names[0], kind)

    def visit_Assign(self, node: cst.Assign) -> None:
        self._assign([t.target for t in node.targets], node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._assign([node.target], node.value)

    def visit_Call(self, node: cst.Call) -> None:
        # ``fully_shard(model)`` wraps in place: the argument's name now holds FSDP2.
        if self._qualified(node.func) & FSDP2_NAMES and node.args:
            first = node.args[0].value
            if isinstance(first, cst.Name):
                self.result.bind(first.value, "fsdp2")


def resolve_wrappers(wrapper: MetadataWrapper) -> Resolution:
    """Resolve the wrappers bound to names in ``wrapper.module``."""
    resolver = _Resolver()
    wrapper.visit(resolver)
    return resolver.result
