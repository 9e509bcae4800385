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


def rss_bytes() -> int:
    """Resident set size of this process, from /proc (0 where unavailable)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


SAMPLE = 1024  # elements read per gradient tensor


def _sample(grad: torch.Tensor) -> torch.Tensor:
    """A fixed strided sample of at most ~SAMPLE elements (a view: no copy, no full read).

    Gradients that were not reduced differ across ranks nearly everywhere, so a sample
    tells synced from diverged at a cost that does not grow with the model.
    """
    flat = grad.reshape(-1)
    step = max(1, flat.numel() // SAMPLE)
    return flat[::step]


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

    def __init__(self, values: torch.Tensor, event: Any | None, sharded: bool, count: int) -> None:
        self._values = values
        self._event = event
        self.sharded = sharded
        self.count = count

    def ready(self) -> bool:
        return self._event is None or bool(self._event.query())

    def result(self) -> list[float]:
        if self._event is not None:
            self._event.synchronize()
        return [float(v) for v in self._values.tolist()]


def fingerprint(optimizer: torch.optim.Optimizer) -> PendingFingerprint | None:
    grads: list[torch.Tensor] = []
    sharded = False
    for group in optimizer.param_groups:
        for param in group["params"]:
            grad = param.grad
            if grad is None or grad.is_sparse:
                continue
            local, is_shard = _local(grad)
            sharded = sharded or is_shard
            grads.append(_sample(local.detach()))
    if not grads:
        return None
    with torch.no_grad():
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for g in grads:
            by_device.setdefault(g.device, []).append(g)
        norms: list[torch.Tensor] = []
        for device_grads in by_device.values():
            norms.extend(n.to(torch.float64) for n in torch._foreach_norm(device_grads))
        device = norms[0].device
        stacked = torch.stack([n.to(device) for n in norms])
        weights = torch.arange(1, len(norms) + 1, device=device, dtype=torch.float64)
        values = torch.stack([stacked.sum(), (stacked * weights).sum() / len(norms)])
        if device.type == "cuda":
            host = torch.empty(2, dtype=torch.float64, pin_memory=True)
            host.copy_(values, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            return PendingFingerprint(host, event, sharded, len(grads))
        return PendingFingerprint(values, None, sharded, len(grads))


def cuda_peak_and_reset() -> int:
    """CUDA peak allocated bytes since the last call (0 without CUDA in use)."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return 0
    peak = int(torch.cuda.max_memory_allocated())
    torch.cuda.reset_peak_memory_stats()
    return peak
