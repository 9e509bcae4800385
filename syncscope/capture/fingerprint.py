"""Gradient fingerprints and memory readings taken on each rank.

A fingerprint is two float64 scalars computed from the per-tensor norms of a fixed strided
sample (about 1,024 elements) of each gradient an optimizer is about to step: their sum and
a position-weighted sum. Ranks whose
gradients were reduced hold identical gradients, hence identical fingerprints. On CUDA the
value is copied to pinned host memory without blocking and read once its event has
completed, so taking it never stalls the training stream.
"""

from __future__ import annotations

import os
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
    """A fingerprint whose device-side value may not be ready yet."""

    def __init__(
        self, values: torch.Tensor | list[float], event: Any | None, sharded: bool, count: int
    ) -> None:
        self._values = values
        self._event = event
        self.sharded = sharded
        self.count = count

    def ready(self) -> bool:
        return self._event is None or bool(self._event.query())

    def result(self) -> list[float]:
        if self._event is not None:
            self._event.synchronize()
        values = self._values if isinstance(self._values, list) else self._values.tolist()
        return [float(v) for v in values]


def fingerprint(optimizer: torch.optim.Optimizer) -> PendingFingerprint | None:
    """Start a fingerprint of the gradients ``optimizer`` is about to step (None: none).

    A handful of tensor ops per step whatever the parameter count: gradients smaller than
    twice the sample are read whole (the norm of the whole tensor is the norm of its
    step-1 sample), larger ones through a strided view, and the norms are reduced in one
    ``torch._foreach_norm`` per device."""
    grads: list[torch.Tensor] = []
    sharded = False
    for group in optimizer.param_groups:
        for param in group["params"]:
            grad = param.grad
            if grad is None or grad.is_sparse:
                continue
            if type(grad) is not torch.Tensor:  # a DTensor (FSDP2, tensor parallelism)
                grad, is_shard = _local(grad)
                sharded = sharded or is_shard
            grads.append(grad if grad.numel() < 2 * SAMPLE else _sample(grad))
    if not grads:
        return None
    count = len(grads)
    with torch.no_grad():
        devices = {g.device for g in grads}
        if len(devices) == 1:
            stacked = torch.stack(torch._foreach_norm(grads))
        else:  # norms in parameter order, gathered on the first gradient's device
            device = grads[0].device
            stacked = torch.stack([torch.linalg.vector_norm(g).to(device) for g in grads])
        if stacked.device.type != "cuda":  # two sums of a few floats: Python is quickest
            norms = stacked.tolist()
            weighted = sum(i * v for i, v in enumerate(norms, 1))
            return PendingFingerprint([sum(norms), weighted / count], None, sharded, count)
        stacked = stacked.to(torch.float64)
        weights = torch.arange(1, count + 1, device=stacked.device, dtype=torch.float64)
        values = torch.stack([stacked.sum(), (stacked * weights).sum() / count])
        host = torch.empty(2, dtype=torch.float64, pin_memory=True)
        host.copy_(values, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return PendingFingerprint(host, event, sharded, count)


def cuda_peak_and_reset() -> int:
    """CUDA peak allocated bytes since the last call (0 without CUDA in use)."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return 0
    peak = int(torch.cuda.max_memory_allocated())
    torch.cuda.reset_peak_memory_stats()
    return peak
