"""Parameter fingerprints: what each parameter holds after an optimizer step.

Taken only where asked (``SYNCSCOPE_PARAM_FINGERPRINTS=1`` in the ranks' environment, as
``syncscope fix --verify`` runs both scripts): once before an optimizer's first step and
after each of its steps, for every parameter it steps (each one, every step: the runs
compared are short). Per parameter, from a fixed strided sample of at most ``SAMPLE``
elements (the samples of ``syncscope.capture.fingerprint``), two float64 numbers: the
position-weighted sum of the sample and the Euclidean norm of the weighted sample (its
scale: what a difference of the sum is measured against, see docs/fix.md).

On the training thread: one view per parameter and one concatenation (a copy, read after
the next step has changed the parameters). The sums are taken where the event is written
(the writer's thread) on CPU; on CUDA the samples are copied to pinned host memory without
blocking and read once their event has completed. The parameters are only read, under
``torch.no_grad``: the job computes exactly what it computes without it.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable
from typing import Any

import torch

from syncscope.capture.fingerprint import SAMPLE
from syncscope.rundir import PARAM_FINGERPRINTS_ENV


def wanted() -> bool:
    """Whether this rank records parameter fingerprints (the environment says so)."""
    return os.environ.get(PARAM_FINGERPRINTS_ENV, "") == "1"


class ParamPlan:
    """One optimizer's parameters as the fingerprints read them: in param-group order, those
    that require a gradient, with each one's name, dtype and sample (elements, stride)."""

    def __init__(self, key: int, params: list[torch.Tensor], names: list[str]) -> None:
        self.key = key  # the ``opt`` of its events: optimizers in order of first step
        self.params = params
        self.names = names
        self.dtypes = [str(p.dtype).replace("torch.", "") for p in params]
        self.samples: list[tuple[int, int]] = []
        for p in params:
            n = _local(p).numel()
            step = max(1, n // SAMPLE)
            self.samples.append((-(-n // step), step))
        sizes = [size for size, _ in self.samples]
        self.segments = torch.repeat_interleave(torch.arange(len(params)), torch.tensor(sizes))
        self.weights = torch.cat(
            [torch.arange(1, k + 1, dtype=torch.float64) / k for k in sizes] or [torch.empty(0)]
        )

    def event(self, optimizer: Any) -> dict[str, Any]:
        """The ``params`` event that names this plan's parameters."""
        return {
            "type": "params",
            "opt": self.key,
            "optimizer": type(optimizer).__name__,
            "names": self.names,
            "dtypes": self.dtypes,
        }

    def take(self, initial: bool = False) -> PendingParams | None:
        """Start the fingerprints of the parameters as they are now (None: none to read)."""
        if not self.params:
            return None
        with torch.no_grad():
            parts = []
            for p, (size, step) in zip(self.params, self.samples, strict=True):
                t = _local(p).detach()
                if not t.is_contiguous():
                    t = t.contiguous()
                parts.append(t.as_strided((size,), (step,), t.storage_offset()))
            device = parts[0].device
            if any(part.device != device for part in parts):
                parts = [part.to(device) for part in parts]
            flat = torch.cat(parts)  # a copy: the next step changes the parameters
            if not flat.is_cuda:
                return PendingParams(self, flat, None, initial)
            host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            host.copy_(flat, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            return PendingParams(self, host, event, initial)


def _local(p: torch.Tensor) -> torch.Tensor:
    """A parameter's rank-local values (an FSDP2 DTensor's shard)."""
    to_local = getattr(p, "to_local", None)
    return to_local() if to_local is not None else p


class PendingParams:
    """Parameter fingerprints whose sums are taken when first read (``fields``)."""

    def __init__(self, plan: ParamPlan, flat: torch.Tensor, event: Any, initial: bool) -> None:
        self._plan = plan
        self._flat = flat
        self._event = event
        self.initial = initial

    def ready(self) -> bool:
        return self._event is None or bool(self._event.query())

    @property
    def on_host(self) -> bool:
        return self._event is None

    def fields(self) -> dict[str, Any]:
        """``values`` and ``scales`` per parameter (None for a value that is not finite:
        NaN and infinity are not JSON); ``initial`` on the one taken before the first step."""
        if self._event is not None:
            self._event.synchronize()
        plan = self._plan
        weighted = self._flat.to(torch.float64) * plan.weights
        count = len(plan.params)
        sums = torch.zeros(count, dtype=torch.float64).index_add_(0, plan.segments, weighted)
        squares = torch.zeros(count, dtype=torch.float64).index_add_(
            0, plan.segments, weighted * weighted
        )
        fields: dict[str, Any] = {
            "values": _finite(sums.tolist()),
            "scales": _finite(squares.sqrt().tolist()),
        }
        if self.initial:
            fields["initial"] = True
        return fields


def _finite(values: list[float]) -> list[float | None]:
    return [v if v == v and abs(v) != float("inf") else None for v in values]


def parameter_names(modules: Iterable[Any], params: list[torch.Tensor]) -> list[str]:
    """Each parameter's name in the wrapped modules that hold it (a DDP module's own
    ``module.`` prefix left out), else ``param[i]`` and its shape (i: its place among the
    optimizer's)."""
    found: dict[int, str] = {}
    for module in modules:
        inner = getattr(module, "module", None)
        root = inner if isinstance(inner, torch.nn.Module) else module
        named = getattr(root, "named_parameters", None)
        if named is None:
            continue
        for name, p in named():
            found.setdefault(id(p), name)
    names = []
    for i, p in enumerate(params):
        shape = "x".join(str(d) for d in p.shape) or "scalar"
        names.append(found.get(id(p), f"param[{i}] ({shape})"))
    return names


class ParamPrints:
    """A rank's parameter-fingerprint plans, one per optimizer (made at its first step)."""

    def __init__(self) -> None:
        # id(optimizer) -> (a weak reference to it, its param groups' sizes, its plan)
        self._plans: dict[int, tuple[weakref.ref[Any], tuple[int, ...], ParamPlan]] = {}
        self._made = 0

    def plan(self, optimizer: Any, modules: Iterable[Any]) -> tuple[ParamPlan, bool]:
        """``optimizer``'s plan, and True when it is new (its ``params`` event is due): made
        again when its param groups change."""
        shape = tuple(len(g["params"]) for g in optimizer.param_groups)
        for key in [k for k, (ref, _, _) in self._plans.items() if ref() is None]:
            del self._plans[key]  # an optimizer gone: its parameters are not held
        entry = self._plans.get(id(optimizer))
        if entry is not None and entry[0]() is optimizer and entry[1] == shape:
            return entry[2], False
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        plan = ParamPlan(self._made, params, parameter_names(modules, params))
        self._made += 1
        self._plans[id(optimizer)] = (weakref.ref(optimizer), shape, plan)
        return plan, True
