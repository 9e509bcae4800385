"""GradScaler's skipped steps: ``scaler.step(optimizer)`` calls ``optimizer.step()`` only
when the unscaled gradients hold no inf/NaN (``GradScaler._maybe_opt_step``), which is
normal in the first steps of an fp16 run while the scale calibrates. No optimizer hook
fires for a skipped step, so its window would run on into the next one, and the
``zero_grad()`` that follows it would read as gradients wiped mid-window. The patch tells
the recorder when a step was skipped; the window ends there, marked skipped.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from syncscope.capture.recorder.core import Recorder


def found_inf(optimizer_state: Any) -> bool:
    """Whether GradScaler found inf/NaN for this optimizer (its own test, on values it has
    already read to the host: no further device sync)."""
    found: Any = None
    if isinstance(optimizer_state, dict):
        found = optimizer_state.get("found_inf_per_device")
    return bool(found) and bool(sum(v.item() for v in found.values()))


def patch_grad_scaler(rec: Recorder, patch: Callable[[Any, str, Any], None]) -> None:
    """Wrap ``torch.amp.GradScaler._maybe_opt_step`` (``torch.cuda.amp.GradScaler`` and
    ``torch.cpu.amp.GradScaler`` derive from it); nothing where torch has no such method."""
    try:
        from torch.amp.grad_scaler import GradScaler
    except ImportError:
        return
    original = getattr(GradScaler, "_maybe_opt_step", None)
    if original is None:
        return
    on_skipped = rec.on_step_skipped

    @functools.wraps(original)
    def maybe_opt_step(
        self: Any, optimizer: Any, optimizer_state: Any, *args: Any, **kwargs: Any
    ) -> Any:
        result = original(self, optimizer, optimizer_state, *args, **kwargs)
        if not rec.detaching and not torch.compiler.is_compiling() and found_inf(optimizer_state):
            on_skipped(optimizer)
        return result

    patch(GradScaler, "_maybe_opt_step", maybe_opt_step)
