"""Instrumentation: the patches and the collective kernels that feed a Recorder.

Everything is installed by ``install(recorder)`` and undone by the returned callable, with
no change to the user's script:

- a Python kernel at the Autograd key of every ``c10d`` op sees every collective (DDP's C++
  reducer and FSDP2 included) with its tensors, group and work (``hooks.collectives``);
- ``torch.autograd.backward`` (which ``Tensor.backward`` calls) marks micro-batches;
- DDP ``forward`` / ``require_backward_grad_sync`` / ``no_sync`` and FSDP2's pre/post forward
  and ``set_requires_gradient_sync`` give the wrapper's sync intent;
- the global optimizer step hooks mark windows; ``zero_grad`` patches mark gradient resets.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import torch

from syncscope.capture import sites
from syncscope.capture.hooks import amp, collectives, funcol
from syncscope.capture.hooks.opaque import no_frame, opaque
from syncscope.capture.recorder.core import Recorder

Undo = Callable[[], None]

_DESTROY_PAUSE_S = 0.05  # seconds without Python's lock before a process group is destroyed


# Patches of sessions that ended while a later session's patch lay over theirs (overlapping
# ``track()`` blocks): id(value) -> (value, had, original). Such a layer stays in the chain,
# its recorder closed (it records nothing); the layer above skips it when it is removed.
_DEAD: dict[int, tuple[Any, bool, Any]] = {}


def _patch(obj: Any, name: str, value: Any, undo: list[Undo]) -> None:
    had = name in vars(obj)
    original = vars(obj).get(name)
    setattr(obj, name, value)

    def restore() -> None:
        if vars(obj).get(name) is not value:  # another session's patch lies over this one
            _DEAD[id(value)] = (value, had, original)
            return
        back_had, back = had, original
        while back_had and id(back) in _DEAD and _DEAD[id(back)][0] is back:
            _, back_had, back = _DEAD.pop(id(back))
        if back_had:
            setattr(obj, name, back)
        else:
            delattr(obj, name)

    undo.append(restore)


def _opaque(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Keep a hook body out of Dynamo's reach: it always runs eagerly, never traced
    (``syncscope.capture.hooks.opaque``: no wrapper cost in a job that does not compile)."""
    return opaque(fn)


def _install_backward(rec: Recorder, undo: list[Undo]) -> None:
    """``torch.autograd.backward`` only: ``Tensor.backward`` calls it by that name, so one
    wrapper sees both (wrapping both cost every backward two wrappers and two hook calls)."""
    autograd_backward = torch.autograd.backward

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def backward(*args: Any, **kwargs: Any) -> Any:
            if rec.detaching:
                rec.detach_now()
                return fn(*args, **kwargs)
            outermost = rec.on_backward_begin()
            try:
                return fn(*args, **kwargs)
            except BaseException:
                if outermost:  # the backward raised: it is no completed micro-batch
                    rec.emit({"type": "bwd_error", "t": rec.now()})
                raise
            finally:
                rec.on_backward_end(outermost)

        return backward

    _patch(torch.autograd, "backward", _opaque(wrap(autograd_backward)), undo)


def _install_optimizer(rec: Recorder, undo: list[Undo]) -> None:
    from torch.optim import Optimizer
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    # the pre-hook may return new (args, kwargs): how a closure gets wrapped
    # the recorder's methods themselves, with no frame between torch's hook loop and them
    pre = register_optimizer_step_pre_hook(_opaque(rec.on_step_begin))
    post = register_optimizer_step_post_hook(_opaque(rec.on_step_end))
    undo.append(pre.remove)
    undo.append(post.remove)

    init = Optimizer.__init__

    @functools.wraps(init)
    def optimizer_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        rec.optimizers.add(self)

    _patch(Optimizer, "__init__", optimizer_init, undo)

    zero_grad = Optimizer.zero_grad
    on_grad_reset = _opaque(rec.on_grad_reset)

    @functools.wraps(zero_grad)
    def optimizer_zero_grad(self: Any, set_to_none: bool = True) -> None:
        if rec.detaching:
            rec.detach_now()
        elif not torch.compiler.is_compiling():
            on_grad_reset("optimizer.zero_grad", set_to_none)
        zero_grad(self, set_to_none)

    _patch(Optimizer, "zero_grad", optimizer_zero_grad, undo)

    module_zero_grad = torch.nn.Module.zero_grad

    @functools.wraps(module_zero_grad)
    def zero_grad_module(self: Any, set_to_none: bool = True) -> None:
        if rec.detaching:
            rec.detach_now()
        elif not torch.compiler.is_compiling():
            on_grad_reset("module.zero_grad", set_to_none)
        module_zero_grad(self, set_to_none)

    _patch(torch.nn.Module, "zero_grad", zero_grad_module, undo)
    amp.patch_grad_scaler(rec, lambda o, n, v: _patch(o, n, v, undo))


_ACCELERATE_STATE = "accelerate.state"


def _accelerate_state() -> dict[str, Any] | None:
    """Accelerate's gradient state, where the job uses Accelerate (read at every forward:
    an ``import`` statement here cost more than the rest of the function)."""
    state_module = sys.modules.get(_ACCELERATE_STATE)
    if state_module is None:
        return None
    shared = getattr(getattr(state_module, "GradientState", None), "_shared_state", None) or {}
    if not shared:
        return None
    kwargs = shared.get("plugin_kwargs") or {}
    return {
        "sync_each_batch": bool(kwargs.get("sync_each_batch", False)),
        "sync_gradients": bool(shared.get("sync_gradients", True)),
        "num_steps": kwargs.get("num_steps"),
    }


def _install_ddp(rec: Recorder, undo: list[Undo]) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    _patch_ddp_init(rec, undo, DDP)
    _patch_ddp_forward(rec, undo, DDP)
    _patch_ddp_comm_hook(rec, undo, DDP)
    _patch_ddp_sync_flag(rec, undo, DDP)


def _patch_ddp_init(rec: Recorder, undo: list[Undo], ddp: Any) -> None:
    """A DDP built is a wrapper of the run, with its parameters and bucket size."""
    init = ddp.__init__

    @functools.wraps(init)
    def ddp_init(self: Any, *args: Any, **kwargs: Any) -> None:
        self.__dict__["_syncscope_init"] = True
        init(self, *args, **kwargs)
        self.__dict__.pop("_syncscope_init", None)
        params = [p for p in self.module.parameters() if p.requires_grad]
        label = rec.on_wrapper(
            "ddp",
            self,
            {
                "params": len(params),
                "param_bytes": sum(p.numel() * p.element_size() for p in params),
                "bucket_cap_bytes": getattr(self, "bucket_bytes_cap", None),
                "static_graph": bool(getattr(self, "static_graph", False)),
                "site": sites.user_site(1),
            },
        )
        _watch_bypass(rec, self.module, label, undo)

    _patch(ddp, "__init__", ddp_init, undo)


def _watch_bypass(rec: Recorder, inner: Any, label: str, undo: list[Undo]) -> None:
    """A forward of the module DDP wraps called around DDP (``ddp_model.module(x)``): DDP's
    reducer is never armed, so the backward reduces nothing. Recorded as a forward of no
    wrapper, at the user's call line.

    The call is seen through the module's ``_compiled_call_impl``, the slot
    ``nn.Module.__call__`` calls first when set: unlike a forward hook it is never pickled or
    deep-copied with the module (``Module.__getstate__`` drops it), and DDP's own call of its
    module (inside DDP's forward, ``fwd_depth`` > 0) passes straight through."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    previous = inner.__dict__.get("_compiled_call_impl")
    call = previous if previous is not None else inner._call_impl
    is_compiling = torch.compiler.is_compiling
    is_grad_enabled = torch.is_grad_enabled
    bypass_label = f"bypass:{label}"
    # kept out of Dynamo: under a compiled frame (a graph break's callee) these run eagerly
    begin = opaque(lambda: rec.on_forward_begin("none", bypass_label, None))
    end = opaque(rec.on_forward_end)

    def bypass_call(*args: Any, **kwargs: Any) -> Any:
        # inside DDP's forward (recorded, or compiled: DDP marks its active module itself)
        if (
            rec.fwd_depth
            or is_compiling()
            or DDP._active_ddp_module is not None
            or rec.detaching
            or not is_grad_enabled()
        ):
            return call(*args, **kwargs)
        begin()
        try:
            return call(*args, **kwargs)
        finally:
            end()

    no_frame(bypass_call)  # a compiled job's frames and graphs stay its own
    object.__setattr__(inner, "_compiled_call_impl", bypass_call)

    def restore() -> None:
        if inner.__dict__.get("_compiled_call_impl") is bypass_call:
            object.__setattr__(inner, "_compiled_call_impl", previous)

    undo.append(restore)


def _patch_ddp_forward(rec: Recorder, undo: list[Undo], ddp: Any) -> None:
    """DDP's forward marks the micro-batch's forward and whether it arms a sync.

    Traced by Dynamo (a compiled DDP model), the wrapper is the bare forward: the graph and
    its breaks are the ones the model has without syncscope, and no forward mark is written
    (windows, micro-batches and collectives come from hooks outside the compiled region)."""
    forward = ddp.forward
    is_compiling = torch.compiler.is_compiling
    is_grad_enabled = torch.is_grad_enabled

    # The forward mark and on_forward_end are not wrapped in torch.compiler.disable (a few
    # hundred nanoseconds a call, and every micro-batch calls them): where Dynamo traces this
    # forward, is_compiling() is true and the body is the bare forward, so neither is
    # reached from a traced frame.
    @functools.wraps(forward)
    def ddp_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if is_compiling():
            return forward(self, *args, **kwargs)
        if rec.detaching:
            rec.detach_now()
            return forward(self, *args, **kwargs)
        known = rec.ddp_labels.get(id(self))  # a plain dict: no weak-dict call per forward
        if known is not None and known[0]() is self:
            label = known[1]
        else:
            label = rec.ddp_modules.get(self) or rec.on_wrapper("ddp", self, {})
        armed = is_grad_enabled() and bool(self.require_backward_grad_sync)
        acc = _accelerate_state() if _ACCELERATE_STATE in sys.modules else None
        rec.on_forward_begin("ddp", label, armed, {"accelerate": acc} if acc else None)
        try:
            return forward(self, *args, **kwargs)
        finally:
            depth = rec.fwd_depth  # rec.on_forward_end(), without a call per forward
            rec.fwd_depth = depth - 1 if depth > 0 else 0

    _patch(ddp, "forward", ddp_forward, undo)


def _patch_ddp_comm_hook(rec: Recorder, undo: list[Undo], ddp: Any) -> None:
    """A Python comm hook's bucket is noted as a gradient bucket before the hook reduces it."""
    register_comm_hook = ddp.register_comm_hook

    @functools.wraps(register_comm_hook)
    def ddp_register_comm_hook(self: Any, state: object, hook: Callable[..., Any]) -> None:
        @functools.wraps(hook)
        def noting_hook(state: object, bucket: Any) -> Any:
            rec.note_ddp_bucket(bucket.buffer())  # what the hook reduces is a gradient bucket
            return hook(state, bucket)

        register_comm_hook(self, state, noting_hook)

    _patch(ddp, "register_comm_hook", ddp_register_comm_hook, undo)


def _patch_ddp_sync_flag(rec: Recorder, undo: list[Undo], ddp: Any) -> None:
    """``require_backward_grad_sync`` as a data descriptor with ``__set__`` only: each set
    is a toggle (``no_sync`` or a direct assignment), except DDP's own during ``__init__``.

    Python reads a data descriptor without ``__get__`` from the instance's ``__dict__``
    (``inspect.getattr_static``, which Dynamo follows, too), where the setter keeps the flag
    as DDP does: DDP reads its flag several times per forward and backward, and each read
    stays a dictionary lookup in C (a property's getter was a Python call per read)."""

    def set_flag(_descriptor: Any, self: Any, value: bool) -> None:
        # kept where DDP keeps it: the flag outlives the descriptor (bounded capture)
        d = self.__dict__
        d["require_backward_grad_sync"] = value
        if "_syncscope_init" in d:
            return
        known = rec.ddp_labels.get(id(self))
        label = known[1] if known is not None and known[0]() is self else None
        rec.on_toggle(None, bool(value), label or rec.ddp_modules.get(self, "ddp:?"))

    flag = type("SyncFlag", (), {"__slots__": (), "__set__": _opaque(set_flag)})
    _patch(ddp, "require_backward_grad_sync", flag(), undo)


FSDP2_MODULE = "torch.distributed.fsdp._fully_shard._fully_shard"
FSDP1_MODULE = "torch.distributed.fsdp.fully_sharded_data_parallel"


def _install_fsdp1(rec: Recorder, undo: list[Undo]) -> None:
    """FSDP1 (needs an accelerator): decides at backward from ``_sync_gradients``."""
    from syncscope.capture.hooks.imports import when_imported

    undo.append(when_imported(FSDP1_MODULE, lambda module: _patch_fsdp1(rec, undo, module)))


def _patch_fsdp1(rec: Recorder, undo: list[Undo], module: Any) -> None:
    fsdp = module.FullyShardedDataParallel
    forward = fsdp.forward

    @functools.wraps(forward)
    def fsdp1_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if rec.fwd_depth == 0 and self not in rec.fsdp1_modules:
            params = [p for p in self.parameters() if p.requires_grad]
            rec.on_wrapper(
                "fsdp",
                self,
                {
                    "params": len(params),
                    "param_bytes": sum(p.numel() * p.element_size() for p in params),
                    "shard_world": int(getattr(self, "world_size", 1) or 1),
                    "fsdp_version": 1,
                },
                key=None,
            )
        label = rec.fsdp1_modules.get(self, "fsdp:inner")
        extra = {"accelerate": acc} if (acc := _accelerate_state()) else None
        rec.on_forward_begin("fsdp", label, bool(getattr(self, "_sync_gradients", True)), extra)
        try:
            return forward(self, *args, **kwargs)
        finally:
            rec.on_forward_end()

    _patch(fsdp, "forward", fsdp1_forward, undo)

    no_sync = fsdp.no_sync

    @functools.wraps(no_sync)
    @contextlib.contextmanager
    def fsdp1_no_sync(self: Any) -> Iterator[None]:
        label = rec.fsdp1_modules.get(self, "fsdp:?")
        rec.on_toggle("no_sync", False, label)
        with no_sync(self):
            yield
        rec.on_toggle("no_sync", True, label)

    _patch(fsdp, "no_sync", fsdp1_no_sync, undo)


def _install_fsdp2(rec: Recorder, undo: list[Undo]) -> None:
    """Hook FSDP2 when the job imports it (importing it ourselves costs seconds per rank)."""
    from syncscope.capture.hooks.imports import when_imported

    undo.append(when_imported(FSDP2_MODULE, lambda _: _patch_fsdp2(rec, undo)))


def _patch_fsdp2(rec: Recorder, undo: list[Undo]) -> None:
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    from torch.distributed.fsdp._fully_shard._fully_shard import FSDPModule

    from syncscope.capture.recorder.gradients import fsdp_reduce_grads

    # FSDP2 keeps its hooks out of Dynamo with ``_dynamo_disable`` (a traced wrapper that
    # calls ``torch._dynamo.disable(hook)``); wrapping the undecorated hooks in that same
    # decorator gives a compiled model the graph breaks it has without syncscope, and our
    # bodies run eagerly even there.
    hide, pre_forward, post_forward = _fsdp_hook_parts(FSDPState)

    @hide
    @functools.wraps(pre_forward)
    def fsdp_pre_forward(self: Any, module: Any, args: Any, kwargs: Any) -> Any:
        if not rec.listening:  # states built during capture keep this hook: pass through
            return pre_forward(self, module, args, kwargs)
        ctx = getattr(self, "_state_ctx", None)
        was_root = ctx is not None and ctx.iter_forward_root is not None
        result = pre_forward(self, module, args, kwargs)
        ctx = getattr(self, "_state_ctx", None)
        if not was_root and ctx is not None and ctx.iter_forward_root is self:
            label = rec.fsdp_roots.get(self) or rec.on_wrapper(
                "fsdp", module, {**_fsdp_info(self), **_fsdp_outer(module)}, key=self
            )
            extra = {"accelerate": acc} if (acc := _accelerate_state()) else None
            rec.on_forward_begin("fsdp", label, fsdp_reduce_grads(self), extra)
            self.__dict__["_syncscope_fwd"] = True
        return result

    @hide
    @functools.wraps(post_forward)
    def fsdp_post_forward(self: Any, module: Any, input: Any, output: Any) -> Any:
        if not rec.listening:
            return post_forward(self, module, input, output)
        result = post_forward(self, module, input, output)
        if self.__dict__.pop("_syncscope_fwd", False):
            rec.on_forward_end()
        return result

    _patch(FSDPState, "_pre_forward", fsdp_pre_forward, undo)
    _patch(FSDPState, "_post_forward", fsdp_post_forward, undo)

    for setter, how in (
        ("set_requires_gradient_sync", "set_requires_gradient_sync"),
        ("set_requires_all_reduce", "set_requires_all_reduce"),
    ):
        original = getattr(FSDPModule, setter)

        def make(original: Any, how: str) -> Any:
            @functools.wraps(original)
            def wrapper(self: Any, value: bool, *args: Any, **kwargs: Any) -> Any:
                result = original(self, value, *args, **kwargs)
                state = self._get_fsdp_state()
                label = rec.fsdp_roots.get(state, f"fsdp:{type(self).__name__}")
                # recurse=False (keyword-only) sets this module's own flag only: its FSDP
                # children keep theirs (and reduce-scatter as before)
                recurse = kwargs.get("recurse", True)
                rec.on_toggle(how, bool(value), label, None if recurse else {"recurse": False})
                return result

            return wrapper

        _patch(FSDPModule, setter, make(original, how), undo)


def _fsdp_hook_parts(
    state_class: Any,
) -> tuple[Callable[[Callable[..., Any]], Callable[..., Any]], Any, Any]:
    """(FSDP2's own hook decorator, undecorated ``_pre_forward``, ``_post_forward``);
    ``torch.compiler.disable`` and the hooks as they are where this torch lacks them."""
    pre, post = state_class._pre_forward, state_class._post_forward
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_common import _dynamo_disable
    except ImportError:
        return _opaque, pre, post
    inner_pre, inner_post = getattr(pre, "__wrapped__", None), getattr(post, "__wrapped__", None)
    if inner_pre is None or inner_post is None:
        return _opaque, pre, post
    return _dynamo_disable, inner_pre, inner_post


def _fsdp_info(state: Any) -> dict[str, Any]:
    from syncscope.capture.recorder.gradients import fsdp_param_groups

    params = 0
    param_bytes = 0
    shard_world = 1
    ctx = getattr(state, "_state_ctx", None)
    for s in list(getattr(ctx, "all_states", None) or [state]):
        for group in fsdp_param_groups(s):
            mesh = getattr(group, "mesh_info", None)
            shard_world = max(shard_world, int(getattr(mesh, "shard_mesh_size", 1) or 1))
            for fp in getattr(group, "fsdp_params", ()):
                size = getattr(fp, "_orig_size", None)
                sharded = getattr(fp, "sharded_param", None)
                if size is None or sharded is None:
                    continue
                params += 1
                param_bytes += int(size.numel()) * sharded.element_size()
    return {"params": params, "param_bytes": param_bytes, "shard_world": shard_world}


def _fsdp_outer(root: Any) -> dict[str, Any]:
    """Where an FSDP2 root sits (once, when it is registered): the FSDP modules under it,
    and the user's outermost module whose ``forward`` is running, when that is not an
    FSDPModule (a sync setter looked up on such a wrapper toggles nothing)."""
    from torch.distributed.fsdp import FSDPModule

    names = [name for name, m in root.named_modules() if isinstance(m, FSDPModule)]
    outer = ""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        owner = frame.f_locals.get("self") if frame.f_code.co_name == "forward" else None
        if isinstance(owner, torch.nn.Module) and owner is not root:
            outer = "" if isinstance(owner, FSDPModule) else type(owner).__name__
        frame = frame.f_back
    info: dict[str, Any] = {"fsdp_modules": names[:64], "outer": outer}
    if outer:  # does the loop around it name a sync setter (that then never reached FSDP)?
        info["setter_mentions"] = sites.setter_mentions(_SETTERS, 2)
    return info


_SETTERS = ("set_requires_gradient_sync", "set_requires_all_reduce")


def _install_dist(rec: Recorder, undo: list[Undo]) -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    init = c10d.init_process_group

    @functools.wraps(init)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = init(*args, **kwargs)
        rec.on_dist_init()
        return result

    _patch(c10d, "init_process_group", init_process_group, undo)
    _patch(dist, "init_process_group", init_process_group, undo)

    destroy = c10d.destroy_process_group

    @functools.wraps(destroy)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        # A gloo worker that has just finished a collective issued in a backward drops the
        # work's Python state (the backward's contextvars context) with the process group's
        # work lock held, taking Python's lock to do it; destroying the group waits for that
        # lock with Python's lock held. A moment without Python's lock first lets such a
        # worker finish (the deadlock syncscope.launch.attach._release avoids at the end of a
        # script, here where the script destroys the group itself).
        time.sleep(_DESTROY_PAUSE_S)
        return destroy(*args, **kwargs)

    _patch(c10d, "destroy_process_group", destroy_process_group, undo)
    _patch(dist, "destroy_process_group", destroy_process_group, undo)


def _install_deepspeed(rec: Recorder, undo: list[Undo]) -> None:
    """Hook DeepSpeed's engine when the job imports it (see ``syncscope.capture.hooks.deepspeed_engine``)."""
    from syncscope.capture.hooks import deepspeed_engine as deepspeed
    from syncscope.capture.hooks.imports import when_imported

    def patch(module: Any) -> None:
        engine_class = module.DeepSpeedEngine
        deepspeed.patch_engine(rec, lambda o, n, v: _patch(o, n, v, undo), engine_class)

    undo.append(when_imported(deepspeed.ENGINE_MODULE, patch))


def install(rec: Recorder) -> Undo:
    """Install every hook for ``rec``; returns a callable that removes them all."""
    undo: list[Undo] = []
    _install_dist(rec, undo)
    _install_backward(rec, undo)
    _install_optimizer(rec, undo)
    _install_ddp(rec, undo)
    _install_fsdp2(rec, undo)
    _install_fsdp1(rec, undo)
    _install_deepspeed(rec, undo)
    undo.append(collectives.attach(rec))
    funcol.patch_functional_collectives(lambda o, n, v: _patch(o, n, v, undo))

    def uninstall() -> None:
        while undo:  # once, from whichever of bounded capture's detach or the session's close
            undo.pop()()

    rec.uninstall = uninstall
    return uninstall
