"""DeepSpeed's engine as a wrapper of the run (ZeRO stages 0-3).

DeepSpeed drives accumulation itself: the loop calls ``engine(x)``, ``engine.backward(loss)``
and ``engine.step()`` on every micro-batch, and the engine acts at its own boundary (every
``gradient_accumulation_steps`` calls of ``step()``). The torch optimizer it steps holds each
rank's flat fp32 partition (ZeRO 1-3), not the model's parameters, so the global optimizer
hooks cannot tell the window. Hooked when the job imports DeepSpeed:

- ``DeepSpeedEngine.__init__``: the engine is a wrapper (``deepspeed``, with its ZeRO stage,
  accumulation steps and data-parallel size) and the framework is recorded as DeepSpeed;
- ``forward``: the micro-batch's forward (ZeRO-3's parameter all-gathers land in it); the
  window's first takes the fingerprint: of the parameters the window computes with, which
  every rank holds whole and identical on a correct job up to ZeRO-2 (a rank that loaded or
  changed its weights alone differs; the post-step all-gather of ZeRO 1-2 would hide it
  after the step), each rank's own partition under ZeRO-3 (sharded: not compared);
- ``backward``: the micro-batch's backward, DeepSpeed's reduction after ``loss.backward()``
  (its backward epilogue) included, so every gradient reduction is in phase ``backward``;
- ``step`` at the boundary: the window's optimizer step, the post-step all-gather of the
  updated partitions included.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import torch

from syncscope.capture.fingerprint import PendingFingerprint, fingerprint_tensors
from syncscope.capture.recorder.core import Recorder
from syncscope.capture.recorder.gradients import deepspeed_reduce_grads

ENGINE_MODULE = "deepspeed.runtime.engine"


def _stage(engine: Any) -> int:
    try:
        return int(engine.zero_optimization_stage())
    except Exception:
        return 0


def engine_info(engine: Any) -> dict[str, Any]:
    """The wrapper event's fields for a DeepSpeed engine."""
    params = [p for p in engine.module.parameters() if p.requires_grad]
    numel = sum(int(getattr(p, "ds_numel", 0) or p.numel()) for p in params)
    size = params[0].element_size() if params else 4
    try:
        gas = int(engine.gradient_accumulation_steps())
    except Exception:
        gas = None
    return {
        "params": len(params),
        "param_bytes": numel * size,
        "shard_world": int(getattr(engine, "dp_world_size", 1) or 1),
        "zero_stage": _stage(engine),
        "accumulation_steps": gas,
    }


def params_fingerprint(engine: Any, window: int) -> PendingFingerprint | None:
    """The parameters before the window's first forward: whole on every rank up to ZeRO-2
    (identical on a correct job), each rank's own partition under ZeRO-3 (sharded)."""
    params = [p for p in engine.module.parameters() if p.requires_grad]
    if not params:
        return None
    if _stage(engine) == 3:
        shards = [t for p in params if (t := getattr(p, "ds_tensor", None)) is not None]
        tensors = [t.detach() for t in shards if t.numel()]
        return fingerprint_tensors(tensors, window, sharded=True) if tensors else None
    return fingerprint_tensors([p.detach() for p in params], window, sharded=False)


def patch_engine(rec: Recorder, patch: Any, engine_class: Any) -> None:
    """Hook ``engine_class`` (DeepSpeedEngine); ``patch(obj, name, value)`` installs one."""
    init, forward = engine_class.__init__, engine_class.forward
    backward, step = engine_class.backward, engine_class.step

    @functools.wraps(init)
    def ds_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        version = getattr(sys.modules.get("deepspeed"), "__version__", "")
        rec.on_engine(self, engine_info(self), str(version or ""))

    @functools.wraps(forward)
    def ds_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling() or not rec.listening:
            return forward(self, *args, **kwargs)
        label = rec.engines.get(self) or rec.on_engine(self, engine_info(self), "")
        if torch.is_grad_enabled():
            rec.fingerprint_window(lambda window: params_fingerprint(self, window))
        rec.on_forward_begin(
            "deepspeed", label, torch.is_grad_enabled() and deepspeed_reduce_grads(self)
        )
        try:
            return forward(self, *args, **kwargs)
        finally:
            rec.on_forward_end()

    @functools.wraps(backward)
    def ds_backward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not rec.listening:
            return backward(self, *args, **kwargs)
        outermost = rec.on_backward_begin()
        try:
            return backward(self, *args, **kwargs)
        except BaseException:
            if outermost:
                rec.emit({"type": "bwd_error", "t": rec.now()})
            raise
        finally:
            rec.on_backward_end(outermost)

    @functools.wraps(step)
    def ds_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not rec.listening:
            return step(self, *args, **kwargs)
        try:
            boundary = bool(self.is_gradient_accumulation_boundary())
        except Exception:
            boundary = True
        if not boundary:
            return step(self, *args, **kwargs)
        rec.on_engine_step_begin(type(self.optimizer).__name__)
        try:
            return step(self, *args, **kwargs)
        finally:
            rec.on_engine_step_end()

    patch(engine_class, "__init__", ds_init)
    patch(engine_class, "forward", ds_forward)
    patch(engine_class, "backward", ds_backward)
    patch(engine_class, "step", ds_step)
