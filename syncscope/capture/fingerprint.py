"""Gradient fingerprints and memory readings taken on each rank.

A fingerprint is one float64 scalar computed from a fixed strided sample (about 1,024
elements) of each of some of the gradients an optimizer is about to step, concatenated: the
position-weighted sum of the samples (one dot product; earlier versions also wrote the sum
of squares, which told nothing the weighted sum does not). Which gradients: at most
``TENSORS`` of them per window, every ``cycle``-th one starting at ``window % cycle``
(``cycle = ceil(count / TENSORS)``), so every gradient is looked at once every ``cycle``
windows and the cost per window does not grow with the parameter count (on CPU each torch
op costs tens of microseconds right after a backward, the dominant cost). Ranks whose
gradients were reduced hold identical gradients, hence identical fingerprints; ranks whose
gradients differ give different sums but for a coincidence of measure zero. The training
thread only copies the samples: on CPU the sum is taken where the value is read (the event
writer's thread); on CUDA it is taken at once and copied to pinned host memory without
blocking, read once its event has completed, so taking it never stalls the training stream.
"""

from __future__ import annotations

import contextlib
import functools
import os
import weakref
from typing import Any

import torch

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


_statm: tuple[int, int] | None = None  # (pid, descriptor of its /proc/PID/statm)


def rss_bytes() -> int:
    """Resident set size of this process, from /proc (0 where unavailable): one ``pread``
    of a descriptor kept open (reopened in a forked child, whose /proc entry differs)."""
    global _statm
    try:
        pid = os.getpid()
        if _statm is None or _statm[0] != pid:
            _statm = (pid, os.open(f"/proc/{pid}/statm", os.O_RDONLY | os.O_CLOEXEC))
        return int(os.pread(_statm[1], 128, 0).split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


SAMPLE = 1024  # elements read per gradient tensor
TENSORS = 4  # gradient tensors fingerprinted per window (rotating over the windows)


def _sample(grad: torch.Tensor) -> torch.Tensor:
    """A fixed strided sample of at most ~SAMPLE elements (a view: no copy, no full read):
    the elements ``flat[::step]`` of the flattened gradient.

    Gradients that were not reduced differ across ranks nearly everywhere, so a sample
    tells synced from diverged at a cost that does not grow with the model. A contiguous
    gradient (nearly all) is viewed with one ``as_strided``, a third of the cost of a
    reshape and a slice (each is a dispatcher call, the dominant cost on CPU).
    """
    n = grad.numel()
    step = max(1, n // SAMPLE)
    if grad.is_contiguous():
        return grad.as_strided((-(-n // step),), (step,), grad.storage_offset())
    return grad.reshape(-1)[::step]


def _local(grad: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The rank-local values of a gradient; True when they are a shard (DTensor Shard)."""
    to_local = getattr(grad, "to_local", None)
    if to_local is None:
        return grad, False
    placements = getattr(grad, "placements", ())
    sharded = any(type(p).__name__ in ("Shard", "_StridedShard") for p in placements)
    return to_local(), sharded


class PendingFingerprint:
    """A fingerprint whose device-side value may not be ready yet. ``count``: the gradients
    present; ``part``: (offset, cycle), the ones fingerprinted being ``offset::cycle``."""

    def __init__(
        self,
        values: torch.Tensor | list[float],
        event: Any | None,
        sharded: bool,
        count: int,
        part: tuple[int, int] = (0, 1),
        weights: torch.Tensor | None = None,
    ) -> None:
        self._values = values
        self._event = event
        self._weights = weights  # set: ``values`` is the samples' copy, not yet summed
        self.sharded = sharded
        self.count = count
        self.part = part

    def ready(self) -> bool:
        return self._event is None or bool(self._event.query())

    @property
    def on_host(self) -> bool:
        """Computed on the CPU: its value is a Python list, readable from any thread."""
        return self._event is None

    def fields(self, value: bool = True) -> dict[str, Any]:
        """The fingerprint's fields as events carry them; ``value``: with ``fp`` itself
        (waits for a device value not ``ready`` yet)."""
        fields: dict[str, Any] = {
            "fp_sharded": self.sharded,
            "fp_count": self.count,
            "fp_part": list(self.part),
        }
        if value:
            fields["fp"] = self.result()
        return fields

    def result(self) -> list[float]:
        """The value (on CPU, the weighted sum is taken here, on whichever thread asks
        first: the samples were copied when the fingerprint was started)."""
        if self._event is not None:
            self._event.synchronize()
        if self._weights is not None:
            assert isinstance(self._values, torch.Tensor)
            self._values = [float(self._values.dot(self._weights))]
            self._weights = None
        values = self._values if isinstance(self._values, list) else self._values.tolist()
        return [float(v) for v in values]


_weights: dict[tuple[int, torch.dtype, str | torch.device], torch.Tensor] = {}


def _weights_for(flat: torch.Tensor) -> torch.Tensor:
    """Positions 1/k .. k/k for a sample of k elements (cached per size, dtype and device;
    a CPU sample's key names no device: building and hashing a ``torch.device`` each step
    cost more than the lookup)."""
    return _weights_of(flat.numel(), flat.dtype, "cpu" if flat.is_cpu else flat.device)


def _weights_of(k: int, dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    key = (k, dtype, device)
    weights = _weights.get(key)
    if weights is None:
        weights = torch.arange(1, k + 1, dtype=torch.float64, device=device) / k
        weights = _weights[key] = weights.to(dtype)
        if len(_weights) > 64:  # a few sizes per model; never grows without bound
            _weights.pop(next(iter(_weights)))
    return weights


def _flat_sample(grads: list[torch.Tensor]) -> torch.Tensor:
    """The gradients' samples, concatenated into a new tensor (a copy even of one sample:
    the gradients change after the step; a gradient under 2 * SAMPLE elements is its own
    sample, the stride being 1)."""
    return torch.cat([_sample(g) for g in grads])


class _Plan:
    """What one optimizer's fingerprints read, worked out once per param-group shape (the
    number of parameters in each group): its trainable parameters in order and, for each
    window's share of them (see ``_share``), every parameter with the (elements, stride)
    of its gradient's sample (stride 0 where the gradient is its own sample: a 1-D tensor
    of under ``2 * SAMPLE`` elements, such as a bias, needs no view). Reading every
    parameter's ``.grad`` each step, to pick a few, cost more than the fingerprint; so did
    working the share and the samples out again. ``weights``: per share, its samples'
    position weights where they are summed on the CPU in float32/64 (the parameters' dtype
    and device are their gradients'), else None (``_start`` works them out)."""

    __slots__ = ("count", "cycle", "parts", "samplers", "shape", "shares", "trainable", "weights")

    def __init__(self, shape: tuple[int, ...], trainable: list[torch.Tensor]) -> None:
        self.shape = shape
        self.trainable = trainable
        self.count = len(trainable)
        self.cycle = max(1, -(-self.count // TENSORS))
        self.shares: list[list[tuple[torch.Tensor, int, int]]] = []
        for offset in range(self.cycle):
            share = []
            for p in trainable[offset :: self.cycle]:
                n = p.numel()
                step = max(1, n // SAMPLE)
                whole = p.dim() == 1 and step == 1
                share.append((p, -(-n // step), 0 if whole else step))
            self.shares.append(share)
        self.parts = [(offset, self.cycle) for offset in range(self.cycle)]
        self.weights = [_plain_weights(share) for share in self.shares]
        self.samplers = _samplers(self.shares)


def _samplers(shares: list[list[tuple[torch.Tensor, int, int]]]) -> list[Any]:
    """Per share, the compiled copier of its samples (``GradSampler``, see
    syncscope/capture/native/), or None where that module is not built: one C++ call copies
    what ``torch.cat`` of the views copies, byte for byte, where each view and the
    concatenation are a dispatcher call of several microseconds right after a backward."""
    from syncscope.capture import native

    module = native.get()
    samplers: list[Any] = []
    for share in shares:
        sampler = None
        if module is not None and share:
            params, sizes, steps = zip(*share, strict=True)
            with contextlib.suppress(Exception):  # a parameter it cannot read: torch copies
                sampler = module.GradSampler(list(params), list(sizes), list(steps))
        samplers.append(sampler)
    return samplers


def _plain_weights(share: list[tuple[torch.Tensor, int, int]]) -> torch.Tensor | None:
    """A share's samples' weights, where its gradients are summed as they are (on the CPU,
    float32 or float64, all of one dtype), else None."""
    dtypes = {p.dtype for p, _, _ in share}
    if not share or len(dtypes) != 1 or not all(p.is_cpu for p, _, _ in share):
        return None
    dtype = share[0][0].dtype
    if dtype not in (torch.float32, torch.float64):
        return None
    return _weights_of(sum(size for _, size, _ in share), dtype, "cpu")


# id(optimizer) -> (a weak reference to it, its plan): a plain dict read (a WeakKeyDictionary's
# lookup is a Python call of its own, on every step)
_plans: dict[int, tuple[weakref.ref[Any], _Plan]] = {}


def _plan(optimizer: torch.optim.Optimizer) -> _Plan:
    """``optimizer``'s plan, made again when its param groups change."""
    groups = optimizer.param_groups
    if len(groups) == 1:
        shape: tuple[int, ...] = (len(groups[0]["params"]),)
    else:
        shape = tuple([len(g["params"]) for g in groups])
    entry = _plans.get(id(optimizer))
    if entry is not None and entry[0]() is optimizer and entry[1].shape == shape:
        return entry[1]
    plan = _Plan(shape, [p for g in groups for p in g["params"] if p.requires_grad])
    key = id(optimizer)
    with contextlib.suppress(TypeError):  # an optimizer-like object without weak refs
        _plans[key] = (weakref.ref(optimizer, functools.partial(_forget_plan, key)), plan)
    return plan


def _forget_plan(key: int, _: Any = None) -> None:
    entry = _plans.get(key)
    if entry is not None and entry[0]() is None:
        del _plans[key]


def _share(items: list[torch.Tensor], window: int) -> tuple[list[torch.Tensor], tuple[int, int]]:
    """Window ``window``'s share of ``items``: every ``cycle``-th from ``window % cycle``,
    at most ``TENSORS`` of them, with its (offset, cycle)."""
    cycle = -(-len(items) // TENSORS)
    offset = window % cycle
    return items[offset::cycle], (offset, cycle)


def fingerprint(optimizer: torch.optim.Optimizer, window: int = 0) -> PendingFingerprint | None:
    """Start a fingerprint of the gradients ``optimizer`` is about to step (None: none), on
    window ``window``'s share of them (see the module's docstring): the position-weighted
    sum of their samples, concatenated.

    A few tensor ops per step whatever the parameter count (on CPU, right after a backward,
    each op costs several microseconds however small its tensors): one view per gradient
    and one concatenation (a copy) on the training thread, or one call of the compiled
    ``GradSampler`` where it is built (the same bytes); on CPU the dot product is taken
    where the value is read (the writer's thread), on CUDA right away. The common case
    (every gradient of the share a dense contiguous tensor of the parameter's shape) takes
    its samples from the plan; anything else takes the general path."""
    plan = _plan(optimizer)
    if not plan.count:
        return None
    offset = window % plan.cycle
    sampler = plan.samplers[offset]
    flat = sampler.take() if sampler is not None else None  # None: torch copies them
    if flat is None:
        parts: list[torch.Tensor] = []
        for p, size, step in plan.shares[offset]:
            g = p.grad
            if g is None or type(g) is not torch.Tensor or g.is_sparse or not g.is_contiguous():
                return _general(plan, window)
            parts.append(g.as_strided((size,), (step,), g.storage_offset()) if step else g)
        try:
            flat = torch.cat(parts)  # a copy, even of one part: read after the step
        except RuntimeError:  # gradients on several devices
            return _general(plan, window)
    weights = plan.weights[offset]
    # summed as it is, on the CPU (the parameters may have moved or changed dtype since)
    if (
        weights is not None
        and flat.is_cpu
        and flat.dtype is weights.dtype
        and not flat.requires_grad
    ):
        return PendingFingerprint(flat, None, False, plan.count, plan.parts[offset], weights)
    return _start(flat, False, plan.count, plan.parts[offset])


def fingerprint_tensors(
    tensors: list[torch.Tensor], window: int, sharded: bool
) -> PendingFingerprint:
    """A fingerprint of window ``window``'s share of ``tensors`` themselves (not of their
    gradients): what a framework leaves identical on every rank after its step, such as
    DeepSpeed's parameters after the post-step all-gather."""
    share, part = _share(tensors, window)
    return _start(_flat_sample(share), sharded, len(tensors), part)


def _general(plan: _Plan, window: int) -> PendingFingerprint | None:
    """The fingerprint when some gradient of the window's share is missing, sparse, a
    DTensor, not contiguous or elsewhere: of the share's gradients present (of every
    present gradient's share if the window's has none), as local tensors."""
    share, part = _share(plan.trainable, window)
    present = [g for p in share if (g := p.grad) is not None and not g.is_sparse]
    if not present:
        present = [g for p in plan.trainable if (g := p.grad) is not None and not g.is_sparse]
        if not present:
            return None
        present, part = _share(present, window)
    grads: list[torch.Tensor] = []
    sharded = False
    for grad in present:
        if type(grad) is not torch.Tensor:  # a DTensor (FSDP2, tensor parallelism)
            grad, is_shard = _local(grad)
            sharded = sharded or is_shard
        grads.append(grad)
    device = grads[0].device
    if any(g.device != device for g in grads):
        grads = [g.to(device) for g in grads]  # rare: one optimizer over several devices
    return _start(_flat_sample(grads), sharded, plan.count, part)


def _start(
    flat: torch.Tensor, sharded: bool, count: int, part: tuple[int, int]
) -> PendingFingerprint:
    """The position-weighted sum of ``flat`` (the samples' copy, which nothing else holds):
    on CPU taken when the value is first read (by the event writer's thread: the training
    thread pays for the copy only); on CUDA copied to pinned host memory without blocking,
    read once its event has completed."""
    if flat.dtype not in (torch.float32, torch.float64):
        flat = flat.float()  # half precision: accumulate in float32
    if flat.requires_grad:  # gradients built with create_graph=True: read, not recorded
        flat = flat.detach()
    weights = _weights_for(flat)
    if not flat.is_cuda:
        return PendingFingerprint(flat, None, sharded, count, part, weights=weights)
    with torch.no_grad():
        on_device = flat.dot(weights).reshape(1).to(torch.float64)
        host = torch.empty(1, dtype=torch.float64, pin_memory=True)
        host.copy_(on_device, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return PendingFingerprint(host, event, sharded, count, part)


def cuda_peak_and_reset() -> int:
    """CUDA peak allocated bytes since the last call (0 without CUDA in use: asked first,
    ``is_initialized`` is a flag read where ``is_available`` asks the driver)."""
    if not torch.cuda.is_initialized() or not torch.cuda.is_available():
        return 0
    peak = int(torch.cuda.max_memory_allocated())
    torch.cuda.reset_peak_memory_stats()
    return peak
