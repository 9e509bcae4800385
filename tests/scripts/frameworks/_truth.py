"""Ground truth for the DeepSpeed test scripts, taken without syncscope: a counting wrapper
of the ``torch.distributed`` Python API (op, bytes, window, micro-batch and phase of every
collective), and a wrapper of the engine's methods that keeps the window, micro-batch and
phase (``deepspeed_zero.py``, ``hf_trainer_deepspeed.py``).

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

_SOURCE = """
def make(name, original, state, log, nbytes):
    def counted(*args, **kwargs):
        if state["counting"]:
            second = name in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_gather",
                              "reduce_scatter")
            payload = kwargs.get("input_tensor", kwargs.get("input", kwargs.get("tensor")))
            if payload is None and args:
                payload = args[1] if second and len(args) > 1 else args[0]
            log.append({"op": name, "bytes": nbytes(payload), "window": state["window"],
                        "micro": state["micro"], "phase": state["phase"]})
        return original(*args, **kwargs)
    return counted

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


def count_collectives(state: dict[str, object], log: list[dict[str, object]]) -> None:
    """Wrap every op in OPS; call before DeepSpeed binds the API (before importing it)."""
    for name in OPS:
        setattr(dist, name, _ns["make"](name, getattr(dist, name), state, log, nbytes))


def phase(
    name: str, original: Callable[..., Any], state: dict[str, object], boundaries: list[int]
) -> Callable[..., Any]:
    """An engine method that keeps ``state``'s phase, window and micro-batch."""
    return _ns["phase"](name, original, state, boundaries)  # type: ignore[no-any-return]
