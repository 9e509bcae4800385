"""Every c10d collective, seen through a Python kernel at the ``Autograd`` dispatch key.

All collectives, DDP's C++ reducer and FSDP2 included, go through the dispatcher as ops of
the ``c10d`` namespace. None of them has an autograd kernel of its own, so syncscope
registers one: it notes the time, redispatches below autograd to the real kernel, and hands
the op's tensors, process group and work to the active recorders. Other ops never reach
Python, which is why this costs nothing measurable where a ``TorchDispatchMode`` (every aten
op through Python) cost 4-10% of window time.

The functional collectives (``_c10d_functional::all_reduce``, ``reduce_scatter_tensor``,
``all_gather_into_tensor``, ``all_to_all_single``, ``broadcast``, ... what DTensor, tensor
parallelism and compiled graphs issue) have no autograd kernel either: the same kind of
kernel sees them, eager and at a compiled graph's run time (aot_eager and inductor both call
the ops). Calls made while a graph is traced (fake or functional tensors) are not collectives
and are ignored. A functional collective returns a tensor instead of a work: its
``wait_tensor`` marks it done where the wait reaches the dispatcher (compiled graphs); in
eager mode the wait happens inside torch's C++ wrapper, so completion is noticed at the
rank's next event once torch's registry of in-flight functional collectives is empty.

Where syncscope's compiled kernel is built (``syncscope.capture.native``), it takes the
``Autograd`` key of ``c10d::allreduce_`` and records DDP's bucket all-reduces itself, the same
records with no Python frame; this module's kernel of that op then sits one key below, at
``ADInplaceOrView``, and sees every call the compiled one hands on.

Collectives syncscope issues itself (``track()``'s gather of every rank's events at its
exit) run inside ``unrecorded()``: no recorder counts them, so a capture around a
``track()`` (``syncscope profile``, an outer ``track()``) sees only the job's.

Not seen: collectives issued under ``torch.inference_mode()`` (inference tensors skip the
autograd keys), and the differentiable ``_c10d_functional_autograd`` variants (they call the
functional ops below autograd).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from syncscope.capture.hooks.opaque import opaque
from syncscope.capture.recorder.core import Recorder, _dtype_name
from syncscope.capture.recorder.records import perf_ns as _perf_ns

_ACTIVE: list[Recorder] = []
_lock = threading.Lock()
_library: Any = None
_functional_library: Any = None
_unrecorded = threading.local()  # .active: the thread is inside ``unrecorded()``


@contextlib.contextmanager
def unrecorded() -> Iterator[None]:
    """Collectives this thread issues in the block are syncscope's own, not the job's: no
    recorder sees them (``track()``'s gather of every rank's events, which a capture around
    it, ``syncscope profile`` or an outer ``track()``, would otherwise count as the user's)."""
    was = getattr(_unrecorded, "active", False)
    _unrecorded.active = True
    with _lock:
        _unrecorded_blocks[0] += 1
        _native_enable()
    try:
        yield
    finally:
        _unrecorded.active = was
        with _lock:
            _unrecorded_blocks[0] -= 1
            _native_enable()


# how many ``unrecorded()`` blocks are open, in any thread: while none is, a collective does
# not look at the thread-local (an attribute lookup on it each collective)
_unrecorded_blocks = [0]


def _listening() -> list[Recorder]:
    """The recorders a collective issued now goes to."""
    if not _ACTIVE or (_unrecorded_blocks[0] and getattr(_unrecorded, "active", False)):
        return []
    if len(_ACTIVE) == 1:  # the common case, without a list comprehension's frame
        return [_ACTIVE[0]] if _ACTIVE[0].listening else []
    return [r for r in _ACTIVE if r.listening]


_boxes: list[Any] = []  # [ProcessGroup, Work], imported at the first collective


def _unbox(
    args: tuple[Any, ...], out: Any, pg_at: int | None = None, work_at: int | None = None
) -> tuple[Any, Any]:
    """The op's ProcessGroup and Work as Python objects (they travel as ScriptObjects);
    ``pg_at`` and ``work_at``: where the op's schema puts them, looked at first."""
    if not _boxes:
        from torch._C._distributed_c10d import ProcessGroup, Work

        _boxes[:] = [ProcessGroup, Work]
    group_class, work_class = _boxes
    script_object = torch.ScriptObject
    if (
        pg_at is not None
        and work_at is not None
        and len(args) > pg_at
        and type(out) is tuple
        and len(out) > work_at
        and isinstance(args[pg_at], script_object)
        and isinstance(out[work_at], script_object)
    ):
        with contextlib.suppress(Exception):
            return group_class.unbox(args[pg_at]), work_class.unbox(out[work_at])
    pg = None
    for arg in args:
        if isinstance(arg, script_object):
            try:
                pg = group_class.unbox(arg)
                break
            except Exception:
                continue
    work = None
    for item in out if isinstance(out, (tuple, list)) else (out,):
        if isinstance(item, script_object):
            try:
                work = work_class.unbox(item)
                break
            except Exception:
                continue
    return pg, work


# Each kernel redispatches to the keys below its own with the op's handle (``redispatch``)
# rather than calling the op again (which enters the dispatcher anew from Python: 50-60 us a
# collective on CPU against about 10 us), under the same guard as before: ops the real
# kernel dispatches in turn (the in-place functional all_reduce_ calls the functional one)
# stay below the key too, so they are neither seen twice nor given autograd.
_BELOW_AUTOGRAD = torch._C._after_autograd_keyset
_BELOW_AD_INPLACE = torch._C._after_ADInplaceOrView_keyset


def _argument_at(op: Any, name: str) -> int | None:
    """The position of the op's argument ``name`` in its schema (None: it has none)."""
    names = [arg.name for arg in op._schema.arguments]
    return names.index(name) if name in names else None


def _typed_at(items: Any, suffix: str) -> int | None:
    """The position of the first schema argument or return whose type ends in ``suffix``."""
    for i, item in enumerate(items):
        if str(item.type).endswith(suffix):
            return i
    return None


def _kernel(name: str, op: Any, key: str = "Autograd") -> Callable[..., Any]:
    """The kernel of c10d op ``name`` at ``key`` ("Autograd", or "ADInplaceOrView" behind the
    compiled kernel, see ``syncscope.capture.native``)."""
    redispatch = op.redispatch
    async_at = _argument_at(op, "async_op")
    # True for the c10d ops: a caller that leaves it out (DDP's reducer) is asynchronous.
    # torch 2.6 and 2.7's ops have no async_op (Python waits on the Work after): each one is
    # taken as blocking, its held records flushed before it
    async_default = async_at is not None and op._schema.arguments[async_at].default_value is True
    pg_at = _typed_at(op._schema.arguments, "c10d.ProcessGroup")
    returns = op._schema.returns
    # a Work among several returns comes back as a tuple (a lone Work is not)
    work_at = _typed_at(returns, "c10d.Work") if len(returns) > 1 else None

    if key == "Autograd":
        below_autograd: Any = torch._C._AutoDispatchBelowAutograd
        below = _BELOW_AUTOGRAD
    else:
        below_autograd, below = torch._C._AutoDispatchBelowADInplaceOrView, _BELOW_AD_INPLACE

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        recorders = _listening()
        if not recorders:
            with below_autograd():
                return redispatch(keyset & below, *args, **kwargs)
        # A blocking collective's record goes to disk before its call, with every event held
        # before it (``call``; its ``coll`` record, with the call's times, follows when the
        # call returns): a rank that hangs in the call, or that its backend aborts there
        # (gloo on a size mismatch: SIGABRT within microseconds), has told everything up to
        # it. One that is asynchronous (DDP's bucket all-reduces, which leave ``async_op`` to
        # its default; torch.distributed's Python calls pass it) returns at once: its record
        # is held with the others, and the writer's flusher puts them on disk (it runs while
        # the rank waits for the collective, Python's lock released).
        if async_at is None:
            blocking = True
        elif len(args) > async_at:
            blocking = args[async_at] is not True
        else:
            blocking = kwargs.get("async_op", async_default) is not True
        called: list[Any] = []
        for rec in recorders:
            try:  # noqa: SIM105 (contextlib.suppress: an object made per collective)
                rec.before_collective(name, args)  # the input is still the rank's own
            except Exception:
                pass
            if blocking and rec.calls_on_disk:
                try:
                    at = rec.now()
                    group = _unbox(args, None)[0]
                    called.append(rec.on_collective(name, args, group, None, at, at, kind="call"))
                except Exception:
                    called.append(None)
                rec.flush()
            else:
                called.append(None)
        start = _perf_ns()  # every recorder's clock: this counter plus its offset
        with below_autograd():
            out = redispatch(keyset & below, *args, **kwargs)
        try:
            pg, work = _unbox(args, out, pg_at, work_at)
        except Exception:
            pg = work = None
        end = _perf_ns()
        for rec, call in zip(recorders, called, strict=True):
            offset = rec._clock_offset
            try:
                if call is not None:
                    rec.collective_returned(call, work, start + offset, end + offset)
                else:
                    rec.on_collective(name, args, pg, work, start + offset, end + offset)
            except Exception as exc:  # a record must never break the user's job
                rec.emit(
                    {"type": "warning", "t": end + offset, "message": f"{name} not recorded: {exc}"}
                )
        return out

    return opaque(kernel)  # never traced by Dynamo


class _FunctionalWork:
    """Stands for a functional collective's work (it has none): completed once waited."""

    __slots__ = ("waited",)

    def __init__(self) -> None:
        self.waited = False

    def is_completed(self) -> bool:
        if self.waited:
            return True
        from torch._C._distributed_c10d import _get_work_registry_size

        return bool(_get_work_registry_size() == 0)


_in_flight: dict[int, _FunctionalWork] = {}  # output storage -> its pending work


def _storage(t: Any) -> int:
    return int(t.untyped_storage().data_ptr()) if isinstance(t, torch.Tensor) else 0


def _real(t: Any) -> bool:
    """A tensor of a real run, not of a graph being traced (fake, functional, meta)."""
    return (
        type(t) is torch.Tensor and t.device.type != "meta" and not torch._is_functional_tensor(t)
    )


def _functional_kernel(name: str, op: Any) -> Callable[..., Any]:
    raw = f"_c10d_functional::{name}"
    group_at = _argument_at(op, "group_name")

    redispatch = op.redispatch

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        recorders = _listening()
        first = args[0] if args else None
        inputs = first if isinstance(first, (list, tuple)) else [first]
        if not recorders or not inputs or not all(_real(t) for t in inputs):
            with torch._C._AutoDispatchBelowADInplaceOrView():
                return redispatch(keyset & _BELOW_AD_INPLACE, *args, **kwargs)
        for rec in recorders:
            rec.flush()  # held events on disk before a collective that might hang
        starts = [r.now() for r in recorders]
        with torch._C._AutoDispatchBelowADInplaceOrView():
            out = redispatch(keyset & _BELOW_AD_INPLACE, *args, **kwargs)
        pg = None
        group = kwargs.get("group_name", args[group_at] if group_at is not None else None)
        if isinstance(group, str):
            from torch._C._distributed_c10d import _resolve_process_group

            try:
                pg = _resolve_process_group(group)  # type: ignore[arg-type]
            except Exception:
                pg = None
        work = _FunctionalWork()
        for item in out if isinstance(out, (list, tuple)) else (out,):
            if _storage(item):
                _in_flight[_storage(item)] = work
        if len(_in_flight) > 4096:  # eager waits are not seen here: forget completed ones
            for key in [k for k, w in _in_flight.items() if w.is_completed()]:
                del _in_flight[key]
        for rec, t0 in zip(recorders, starts, strict=True):
            t1 = rec.now()
            try:
                rec.on_collective(
                    raw,
                    args,
                    pg,
                    work,
                    t0,
                    t1,
                    tensors=[t for t in inputs if isinstance(t, torch.Tensor)],
                )
            except Exception as exc:  # a record must never break the user's job
                rec.emit({"type": "warning", "t": t1, "message": f"{raw} not recorded: {exc}"})
        return out

    return opaque(kernel)


def _wait_kernel(op: Any) -> Callable[..., Any]:
    redispatch = op.redispatch

    def kernel(keyset: Any, tensor: Any) -> Any:
        with torch._C._AutoDispatchBelowADInplaceOrView():
            out = redispatch(keyset & _BELOW_AD_INPLACE, tensor)
        work = _in_flight.pop(_storage(tensor), None) if _in_flight else None
        if work is not None:
            work.waited = True
            for rec in _ACTIVE:
                if rec.listening:
                    rec.poll_works()  # the wait marks the collective's completion: "done"
        return out

    return opaque(kernel)


# functional ops that are not collectives
_NOT_COLLECTIVES = ("_wrap_tensor_autograd",)


def _register_functional() -> Any:
    library = torch.library.Library("_c10d_functional", "IMPL")
    for full in torch._C._dispatch_get_all_op_names():
        namespace, _, name = full.partition("::")
        if namespace != "_c10d_functional" or "." in name or name in _NOT_COLLECTIVES:
            continue
        op = getattr(getattr(torch.ops._c10d_functional, name, None), "default", None)
        if op is None:
            continue
        if name == "wait_tensor":
            library.impl(name, _wait_kernel(op), "ADInplaceOrView", with_keyset=True)
        else:
            library.impl(name, _functional_kernel(name, op), "ADInplaceOrView", with_keyset=True)
    return library


# the op the compiled kernel sits in front of (DDP's reducer issues its buckets with it)
NATIVE_OP = "allreduce_"


def _register(native: bool) -> Any:
    """The Python kernels of every c10d op; ``native``: the compiled kernel takes
    ``NATIVE_OP``'s Autograd key, and its Python kernel sits one key below."""
    library = torch.library.Library("c10d", "IMPL")
    for full in torch._C._dispatch_get_all_op_names():
        namespace, _, name = full.partition("::")
        if namespace != "c10d" or "." in name:
            continue
        packet = getattr(torch.ops.c10d, name, None)
        op = getattr(packet, "default", None)
        if op is None:
            continue
        key = "ADInplaceOrView" if native and name == NATIVE_OP else "Autograd"
        library.impl(name, _kernel(name, op, key), key, with_keyset=True)
    return library


_native: list[Any] = []  # [the compiled module] while its kernel is registered


def _native_register() -> bool:
    """Register the compiled kernel where it is built (``syncscope.capture.native``)."""
    from syncscope.capture import native

    module = native.get()
    if module is None:
        return False
    try:
        # named as the Python kernel's records name them
        module.set_dtype_names(
            {v: _dtype_name(v) for v in vars(torch).values() if type(v) is torch.dtype}
        )
        module.register_kernel()
    except Exception as exc:
        native.failed(f"cannot register it: {exc}")
        return False
    _native[:] = [module]
    return True


def _native_retarget() -> None:
    """The compiled kernel records for the one active recorder, where there is one and it
    writes no profiler trace (else every call goes to the Python kernel); the lock is held."""
    if not _native:
        return
    from torch._C._distributed_c10d import Work
    from torch.autograd.graph import _engine_run_backward

    rec = _ACTIVE[0] if len(_ACTIVE) == 1 and _ACTIVE[0].trace is None else None
    offset = rec._clock_offset if rec is not None else 0
    _native[0].set_target(rec, _engine_run_backward.__code__, Work.unbox, offset)
    _native_enable()


def _native_enable() -> None:
    """Off while an ``unrecorded()`` block is open (the lock is held)."""
    if _native:
        _native[0].set_enabled(_unrecorded_blocks[0] == 0)


def attach(rec: Recorder) -> Callable[[], None]:
    """Send every collective to ``rec`` until the returned callable is called."""
    global _library, _functional_library
    with _lock:
        if _library is None:
            _library = _register(_native_register())
        if _functional_library is None:
            try:
                _functional_library = _register_functional()
            except Exception:  # a torch without functional collectives: c10d ops only
                _functional_library = None
        _ACTIVE.append(rec)
        _native_retarget()

    def detach() -> None:
        global _library, _functional_library
        with _lock:
            if rec in _ACTIVE:
                _ACTIVE.remove(rec)
            _native_retarget()
            if not _ACTIVE and _native:
                _native.pop().unregister_kernel()
            if not _ACTIVE and _library is not None:
                _library._destroy()
                _library = None
            if not _ACTIVE and _functional_library is not None:
                _functional_library._destroy()
                _functional_library = None
                _in_flight.clear()

    return detach
