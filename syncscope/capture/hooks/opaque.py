"""Keeping hook bodies out of Dynamo's reach at no cost in eager mode.

``torch.compiler.disable(fn)`` is the supported way to make ``fn`` opaque to Dynamo: a
traced frame that calls it graph-breaks there and runs it eagerly, and no frame of it or of
its callees is ever compiled (the wrapper unsets Dynamo's frame-evaluation callback for the
call). That wrapper is Python of its own, five calls deep: 0.3 us warm, and several times
that at a hook point reached right after a backward or a collective, a few hundred times a
second. A job that never compiles pays it for nothing.

``opaque(fn)`` goes through ``torch.compiler.disable(fn)`` only where Dynamo could see the
call: while it traces (``torch.compiler.is_dynamo_compiling()``, which Dynamo reads as true and
eager code as false, checked first so that a traced call never reaches the C check) or
while its callback is set (code running eagerly under a compiled frame: a graph break's
callee, a kernel the dispatcher calls from a compiled graph). Otherwise, which is every
call of an eager job, ``fn`` is called directly. On torch 2.6 and 2.7 the check itself is
unsafe (each call frees a reference of Dynamo's callback: a compiled job crashes), and there
``opaque(fn)`` is always the supported wrapper. The wrapper's own code is marked so that
Dynamo never compiles a frame of it (``skip_code``); where it inlines a call to it, it
reaches the disabled function and breaks the graph there as it would at the disabled
function itself (same graph breaks, same graphs: tests/unit/capture/hooks/test_opaque.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from syncscope.capture.release import torch_release


def no_frame(fn: Callable[..., Any]) -> None:
    """Dynamo may inline ``fn`` into a graph it traces, but never starts a frame in it."""
    try:
        from torch._dynamo.eval_frame import skip_code
    except ImportError:
        return
    skip_code(fn.__code__)


# the first release whose get_eval_frame_callback returns a new reference: on 2.6 and 2.7 each
# call gives away one reference of Dynamo's callback without taking one (measured: the
# refcount falls by one a call), so a compiled job that reaches a hook under the callback
# frees it, and a later compile crashes with a segmentation fault
_CALLBACK_SAFE_FROM = (2, 8)


def _callback_getter() -> Callable[[], Any] | None:
    if torch_release() < _CALLBACK_SAFE_FROM:
        return None
    try:
        from torch._C._dynamo.eval_frame import get_eval_frame_callback
    except ImportError:
        return None
    return get_eval_frame_callback  # type: ignore[no-any-return]


def _own(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, or a function calling it where ``fn`` carries ``_torchdynamo_orig_callable``:
    a hook that ``functools.wraps`` a disabled one (a later session's patch over an earlier
    one's) copies it, and ``torch.compiler.disable`` (2.6 to 2.8 at least) unwraps to that
    callable, which would run the hook beneath instead of this one."""
    if "_torchdynamo_orig_callable" not in getattr(fn, "__dict__", {}):
        return fn

    def own(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return own


def opaque(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, run as ``torch.compiler.disable(fn)`` wherever Dynamo could trace it or its
    callees, and called directly otherwise (see the module's docstring)."""
    disabled: Callable[..., Any] = torch.compiler.disable(_own(fn))
    callback = _callback_getter()
    if callback is None:  # a torch without a safe check (before 2.8): the supported wrapper
        return disabled
    # True only where Dynamo traces (a constant it folds): is_compiling(), also true under
    # non-strict export, runs two Python calls per hook, and either branch runs ``fn`` there
    is_tracing = torch.compiler.is_dynamo_compiling

    def hook(*args: Any, **kwargs: Any) -> Any:
        if is_tracing() or callback() is not None:
            return disabled(*args, **kwargs)
        return fn(*args, **kwargs)

    no_frame(hook)
    functools.update_wrapper(hook, fn)
    return hook
