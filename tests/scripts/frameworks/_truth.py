"""Ground truth for the test scripts, taken without syncscope: a counting wrapper of the
``torch.distributed`` Python API (op, bytes, window, micro-batch and phase of every
collective), a pass-through DDP comm hook that counts the buckets DDP reduces (DDP's own
reducer calls c10d from C++, out of the Python API's sight: the hook hands each bucket to
torch's ``allreduce_hook``, which reduces it as DDP would), and a wrapper of a DeepSpeed
engine's methods that keeps the window, micro-batch and phase (``deepspeed_zero.py``,
``hf_trainer_deepspeed.py``, ``tests/scripts/cuda_loops.py``; the counting itself is checked
on CPU by tests/unit/test_ground_truth.py).

The wrappers are compiled under a file name in angle brackets: syncscope takes such code for
library code, so a collective DeepSpeed issues through them is still DeepSpeed's and the
user's own all-reduce is still the user's (a wrapper defined in a script would be the user's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

OPS = (
    "all_reduce",
    "reduce_scatter_tensor",
    "reduce_scatter",
    "all_gather_into_tensor",
    "all_gather",
    "broadcast",
    "reduce",
)
# the newer entry points, where this torch has them (torch 2.13's FSDP2 reduce-scatters with
# reduce_scatter_single and all-gathers with all_gather_single)
NEWER_OPS = ("reduce_scatter_single", "all_gather_single", "all_reduce_coalesced")

_SOURCE = """
def make(name, original, state, log, nbytes):
    def counted(*args, **kwargs):
        if state["counting"]:
            second = name in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_gather",
                              "reduce_scatter", "reduce_scatter_single", "all_gather_single")
            payload = kwargs.get("input_tensor", kwargs.get("input", kwargs.get("tensor")))
            if payload is None and args:
                payload = args[1] if second and len(args) > 1 else args[0]
            log.append({"op": name, "bytes": nbytes(payload), "window": state["window"],
                        "micro": state["micro"], "phase": state["phase"]})
        return original(*args, **kwargs)
    return counted

def bucket_hook(inner, state, buckets):
    def hook(process_group, bucket):
        if state["counting"]:
            buffer = bucket.buffer()
            buckets.append({"bytes": buffer.numel() * buffer.element_size(),
                            "window": state["window"], "micro": state["micro"],
                            "phase": state["phase"]})
        return inner(process_group, bucket)
    return hook

def phase(name, original, state, boundaries):
    def wrapped(self, *args, **kwargs):
        outer = state["phase"]
        boundary = name == "step" and self.is_gradient_accumulation_boundary()
        state["phase"] = name
        try:
            return original(self, *args, **kwargs)
        finally:
            state["phase"] = outer
            if name == "backward":
                state["total"] = state.get("total", 0) + 1
            if boundary:
                boundaries.append(state["total"] - 1)
                state["window"] += 1
                state["micro"] = 0
            elif name == "backward" and not self.is_gradient_accumulation_boundary():
                state["micro"] += 1
    return wrapped
"""
_ns: dict[str, Any] = {}
exec(compile(_SOURCE, "<ground-truth>", "exec"), _ns)


def nbytes(value: object) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(nbytes(v) for v in value)
    return 0


def all_ops() -> tuple[str, ...]:
    """OPS and those of NEWER_OPS that this torch has."""
    return OPS + tuple(name for name in NEWER_OPS if hasattr(dist, name))


def count_collectives(
    state: dict[str, object], log: list[dict[str, object]], ops: tuple[str, ...] = OPS
) -> None:
    """Wrap every op in ``ops``; call before a framework binds the API (before importing
    it). ``state`` holds "counting", "window", "micro" and "phase"."""
    for name in ops:
        setattr(dist, name, _ns["make"](name, getattr(dist, name), state, log, nbytes))


def count_buckets(model: Any, state: dict[str, object], buckets: list[dict[str, object]]) -> None:
    """Register on the DDP ``model`` a comm hook that logs each bucket (bytes, window,
    micro-batch, phase) and reduces it with torch's ``allreduce_hook``: what DDP's built-in
    reduction does (divide by the group's size, all-reduce), through the Python API."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    model.register_comm_hook(None, _ns["bucket_hook"](allreduce_hook, state, buckets))


def phase(
    name: str, original: Callable[..., Any], state: dict[str, object], boundaries: list[int]
) -> Callable[..., Any]:
    """An engine method that keeps ``state``'s phase, window and micro-batch."""
    return _ns["phase"](name, original, state, boundaries)  # type: ignore[no-any-return]
