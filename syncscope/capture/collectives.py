"""Every c10d collective, seen through a Python kernel at the ``Autograd`` dispatch key.

All collectives, DDP's C++ reducer and FSDP2 included, go through the dispatcher as ops of
the ``c10d`` namespace. None of them has an autograd kernel of its own, so syncscope
registers one: it notes the time, redispatches below autograd to the real kernel, and hands
the op's tensors, process group and work to the active recorders. Other ops never reach
Python, which is why this costs nothing measurable where a ``TorchDispatchMode`` (every aten
op through Python) cost 4-10% of window time.

Not seen: collectives issued under ``torch.inference_mode()`` (inference tensors skip the
autograd keys) and the functional collectives of ``_c10d_functional`` (DTensor, compile).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from syncscope.capture.recorder import Recorder

_ACTIVE: list[Recorder] = []
_lock = threading.Lock()
_library: Any = None


def _unbox(args: tuple[Any, ...], out: Any) -> tuple[Any, Any]:
    """The op's ProcessGroup and Work as Python objects (they travel as ScriptObjects)."""
    from torch._C._distributed_c10d import ProcessGroup, Work  # cached after the first call

    pg = None
    for arg in args:
        if isinstance(arg, torch.ScriptObject):
            try:
                pg = ProcessGroup.unbox(arg)
                break
            except Exception:
                continue
    work = None
    for item in out if isinstance(out, (tuple, list)) else (out,):
        if isinstance(item, torch.ScriptObject):
            try:
                work = Work.unbox(item)
                break
            except Exception:
                continue
    return pg, work


def _kernel(name: str, op: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        recorders = [r for r in _ACTIVE if r.listening and not r.internal()]
        starts = [r.now() for r in recorders]
        with torch._C._AutoDispatchBelowAutograd():
            out = op(*args, **kwargs)
        if not recorders:
            return out
        try:
            pg, work = _unbox(args, out)
        except Exception:
            pg = work = None
        for rec, t0 in zip(recorders, starts, strict=True):
            t1 = rec.now()
            try:
                rec.on_collective(name, args, pg, work, t0, t1)
            except Exception as exc:  # a record must never break the user's job
                rec.emit({"type": "warning", "t": t1, "message": f"{name} not recorded: {exc}"})
        return out

    opaque: Callable[..., Any] = torch.compiler.disable(kernel)  # never traced by Dynamo
    return opaque


def _register() -> Any:
    library = torch.library.Library("c10d", "IMPL")
    for full in torch._C._dispatch_get_all_op_names():
        namespace, _, name = full.partition("::")
        if namespace != "c10d" or "." in name:
            continue
        packet = getattr(torch.ops.c10d, name, None)
        op = getattr(packet, "default", None)
        if op is None:
            continue
        library.impl(name, _kernel(name, op), "Autograd")
    return library


def attach(rec: Recorder) -> Callable[[], None]:
    """Send every collective to ``rec`` until the returned callable is called."""
    global _library
    with _lock:
        if _library is None:
            _library = _register()
        _ACTIVE.append(rec)

    def detach() -> None:
        global _library
        with _lock:
            if rec in _ACTIVE:
                _ACTIVE.remove(rec)
            if not _ACTIVE and _library is not None:
                _library._destroy()
                _library = None

    return detach


def active_recorder() -> Recorder | None:
    return _ACTIVE[-1] if _ACTIVE else None
