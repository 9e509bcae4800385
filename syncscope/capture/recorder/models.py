"""The recorder's view of the wrapped models of a rank that steps several (a part of ``Recorder``).

Where a rank wraps two or more models (a GAN's D and G, each a DDP model or an FSDP root),
each backward records which of them it gave gradients to, and each FSDP reduction which
root's gradients it reduces, so that every model is judged on its own (see
``syncscope.model.per_model``). With one model nothing here reads anything.

Whose gradients a backward changed: per model, the identity and version counter of the
gradients of a spread sample of at most _GRAD_SAMPLE of its parameters, read at the
backward's begin and end. A DDP model's are its parameters' ``.grad``. An FSDP2 root's are,
per sampled ``FSDPParam``, the sharded parameter's ``.grad`` (written by a reduce-scatter)
and the unsharded gradient held between reductions (``set_requires_gradient_sync(False)``
keeps it there); an FSDP1 root's, its flat parameters' ``.grad`` and the reduced shard
FSDP1 saves (``_saved_grad_shard``).
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

import torch

from syncscope.capture.recorder.gradients import fsdp_param_groups

_GRAD_SAMPLE = 4  # gradients looked at per model around each backward


def _stamp(t: object) -> object:
    """A gradient's identity and version (in place changes bump the version); a DTensor's
    local tensor is the one written in place (FSDP2 accumulates into it)."""
    if not isinstance(t, torch.Tensor):
        return None
    local = getattr(t, "_local_tensor", None)
    version = (local if isinstance(local, torch.Tensor) else t)._version
    return (id(t), version)


def _fsdp2_holders(state: Any) -> list[object]:
    """An FSDP2 root's ``FSDPParam`` objects, its own and its FSDP children's."""
    ctx = getattr(state, "_state_ctx", None)
    states = list(getattr(ctx, "all_states", None) or [state])
    return [p for s in states for g in fsdp_param_groups(s) for p in getattr(g, "fsdp_params", ())]


def _fsdp2_grads(fsdp_param: Any) -> tuple[object, ...]:
    sharded = getattr(fsdp_param, "sharded_param", None)
    unsharded = getattr(fsdp_param, "_unsharded_param", None)
    return (
        _stamp(getattr(sharded, "grad", None)),
        _stamp(getattr(unsharded, "grad", None)),
        _stamp(getattr(fsdp_param, "unsharded_accumulated_grad", None)),
    )


def _param_grads(p: Any) -> tuple[object, ...]:
    return (_stamp(p.grad), _stamp(getattr(p, "_saved_grad_shard", None)))


def _spread(items: list[Any]) -> list[Any]:
    return items[:: max(1, -(-len(items) // _GRAD_SAMPLE))]


class ModelIndex:
    """Which wrapped model each backward and each FSDP reduction belongs to."""

    if TYPE_CHECKING:  # the recorder's, used here
        ddp_labels: dict[int, tuple[weakref.ref[Any], str]]
        fsdp_roots: weakref.WeakKeyDictionary[Any, str]
        fsdp1_modules: weakref.WeakKeyDictionary[Any, str]

    def _init_models(self) -> None:
        # label -> (its gradients' sampler, the holders it samples); built on first use
        self._model_sample: dict[str, tuple[Callable[[Any], tuple[object, ...]], list[Any]]] = {}
        self._model_grads: dict[str, tuple[object, ...]] | None = None  # at backward begin
        self._fsdp_owner: dict[int, str] = {}  # id(FSDP2 param group / FSDP1 state) -> label

    def _forget_models(self) -> None:
        self._model_sample, self._model_grads, self._fsdp_owner = {}, None, {}

    def model_count(self) -> int:
        return len(self.ddp_labels) + len(self.fsdp_roots) + len(self.fsdp1_modules)

    def _model_refs(self) -> list[tuple[str, Any, str]]:
        """(label, the live wrapper object, kind) of every wrapped model."""
        refs = [(label, ref(), "ddp") for ref, label in list(self.ddp_labels.values())]
        refs += [(label, state, "fsdp2") for state, label in list(self.fsdp_roots.items())]
        refs += [(label, module, "fsdp1") for module, label in list(self.fsdp1_modules.items())]
        return [r for r in refs if r[1] is not None]

    def _sample_of(self, label: str, obj: Any, kind: str) -> list[tuple[object, ...]]:
        known = self._model_sample.get(label)
        if known is None or not known[1]:
            if kind == "fsdp2":
                known = (_fsdp2_grads, _spread(_fsdp2_holders(obj)))
            else:
                known = (_param_grads, _spread(list(obj.parameters())))
            self._model_sample[label] = known
        read, holders = known
        return [read(h) for h in holders]

    def model_grad_state(self) -> dict[str, tuple[object, ...]] | None:
        """With several wrapped models: per model, the stamps of its sampled gradients,
        which a backward that gives it gradients changes. None with one model or none:
        nothing to tell apart, nothing read."""
        if self.model_count() < 2:
            return None
        return {
            label: tuple(self._sample_of(label, obj, kind))
            for label, obj, kind in self._model_refs()
        }

    def models_with_new_grads(self) -> list[str] | None:
        """The models whose sampled gradients the backward that just ended changed
        (compared with ``model_grad_state`` at its begin); None with fewer than two."""
        before = self._model_grads
        if before is None:
            return None
        after = self.model_grad_state() or {}
        return [label for label, state in after.items() if before.get(label) != state]

    def _fsdp_owners(self) -> dict[int, str]:
        """id(FSDP2 param group or FSDP1 state) -> the label of the root it belongs to."""
        owners: dict[int, str] = {}
        for state, label in list(self.fsdp_roots.items()):
            ctx = getattr(state, "_state_ctx", None)
            for s in list(getattr(ctx, "all_states", None) or [state]):
                for group in fsdp_param_groups(s):
                    owners[id(group)] = label
        for module, label in list(self.fsdp1_modules.items()):
            for s in list(getattr(module, "_all_fsdp_states", None) or [module]):
                owners[id(s)] = label
        return owners

    def fsdp_model_of_reduction(self, skip: int = 1) -> str:
        """With several wrapped models: the FSDP root whose gradients the collective being
        issued reduces (the param group FSDP2 reduces for, the state FSDP1's post-backward
        hook runs for, found on the stack); "" with one model or when none is found."""
        if self.model_count() < 2:
            return ""
        frame: FrameType | None = sys._getframe(skip + 1)
        for _ in range(64):
            if frame is None:
                break
            local = frame.f_locals
            for name in ("self", "state"):
                owner = local.get(name)
                if owner is None:
                    continue
                label = self._fsdp_owner.get(id(owner))
                if label is None and type(owner).__name__ in (
                    "FSDPParamGroup",
                    "FullyShardedDataParallel",
                ):
                    self._fsdp_owner = self._fsdp_owners()
                    label = self._fsdp_owner.get(id(owner))
                if label:
                    return label
            frame = frame.f_back
        return ""
