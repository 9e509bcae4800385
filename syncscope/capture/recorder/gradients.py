"""The recorder's gradient index and content probes (a part of ``Recorder``).

Which parameters the job trains (its optimizers', else its wrapped models'), a spread sample
of them whose ``.grad`` tells a reset (``grad = None``) between backwards, and, per
collective, whether its tensors share storage with a gradient or a DDP bucket handed to a
comm hook, or (the content probe, before a user all-reduce outside backward) hold the
gradients' values. ``Recorder`` inherits this class: its state is the recorder's own
attributes, set by ``_init_gradients``, so the hot hooks read it with no indirection.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import TYPE_CHECKING, Any

import torch

from syncscope.model import input_argument, normalize_op

_GRAD_SAMPLE = 4  # parameters whose .grad is looked at around backwards (a reset)


# Probes of the gradients themselves, used where storage and flags alone cannot tell.
_CONTENT_PROBES = 8  # gradients (or elements of one) compared per candidate tensor


def holds_grads(t: torch.Tensor, grads: list[torch.Tensor], grad_ptrs: set[int]) -> bool:
    """Whether ``t`` holds the values of the gradients, flattened in parameter order (all of
    them) or of one gradient: probed at a few spread positions, which must match exactly,
    with at least one non-zero. Sizes alone decide nothing: a loss of one element has the
    size of a bias gradient but not its value."""
    if t.untyped_storage().data_ptr() in grad_ptrs or t.numel() == 0:
        return False
    flat = t.detach().reshape(-1)
    total = sum(g.numel() for g in grads)
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    if flat.numel() == total and all(g.dtype == t.dtype and g.device == t.device for g in grads):
        offsets = [0]
        for g in grads[:-1]:
            offsets.append(offsets[-1] + g.numel())
        stride = max(1, len(grads) // _CONTENT_PROBES)
        for i in range(0, len(grads), stride):
            g = grads[i].detach().reshape(-1)
            at = torch.tensor([offsets[i], offsets[i] + g.numel() - 1], device=t.device)
            pairs.append((flat.index_select(0, at), g[[0, -1]]))
    else:
        same = [g for g in grads if g.numel() == flat.numel() and g.dtype == t.dtype]
        for g in same[:_CONTENT_PROBES]:
            if g.device != t.device:
                continue
            step = max(1, flat.numel() // _CONTENT_PROBES)
            candidate = g.detach().reshape(-1)
            if torch.equal(flat[::step], candidate[::step]) and bool(flat[::step].any()):
                return True
        return False
    if not pairs:
        return False
    mine = torch.cat([a for a, _ in pairs])
    theirs = torch.cat([b for _, b in pairs])
    return torch.equal(mine, theirs) and bool(mine.any())


def fsdp_param_groups(state: Any) -> list[Any]:
    """An FSDP2 state's parameter groups, on every torch release: ``_fsdp_param_groups`` (a
    list, torch 2.13 on) or the single ``_fsdp_param_group`` before it (None when the module
    holds no parameters of its own)."""
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    group = getattr(state, "_fsdp_param_group", None)
    return [] if group is None else [group]


def fsdp_reduce_grads(state: Any) -> bool:
    """FSDP2: whether the root's param groups will reduce gradients at the next backward."""
    ctx = getattr(state, "_state_ctx", None)
    states = list(getattr(ctx, "all_states", None) or [state])
    flags = [
        bool(getattr(group, "reduce_grads", True)) for s in states for group in fsdp_param_groups(s)
    ]
    return all(flags) if flags else True


def deepspeed_reduce_grads(engine: Any) -> bool:
    """Whether the engine's next backward reduces gradients: at its boundary, or always
    from ZeRO-2 on (each rank keeps only its partition of the gradients)."""
    try:
        return int(engine.zero_optimization_stage()) >= 2 or bool(
            engine.is_gradient_accumulation_boundary()
        )
    except Exception:
        return True


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        out: list[torch.Tensor] = []
        for item in value:  # a list of tensors (the c10d ops' own): no call per tensor
            if isinstance(item, torch.Tensor):
                out.append(item)
            else:
                out.extend(_tensors(item))
        return out
    return []


_input_at: dict[str, int] = {}  # op name -> input_argument(op name), per op seen


def _op_tensors(opname: str, args: tuple[Any, ...]) -> list[torch.Tensor]:
    """The tensors a c10d op reads (its input: the second argument for gathers/scatters)."""
    index = _input_at.get(opname)
    if index is None:
        index = _input_at[opname] = input_argument(opname)
    return _tensors(args[index]) if len(args) > index else []


class GradientIndex:
    """The job's parameters and gradients as capture needs them."""

    if TYPE_CHECKING:  # the recorder's, used here
        bwd_depth: int
        optimizers: weakref.WeakSet[Any]
        engines: weakref.WeakKeyDictionary[Any, str]
        ddp_modules: weakref.WeakKeyDictionary[Any, str]
        fsdp1_modules: weakref.WeakKeyDictionary[Any, str]
        fsdp_roots: weakref.WeakKeyDictionary[Any, str]

    def _init_gradients(self) -> None:
        self._grads_freed = False  # ZeRO-2/3: the model's .grad is freed once reduced
        self._grads_after_backward = -1
        self._reset_since_backward = False
        self._grad_ptrs: set[int] | None = None
        self._grad_numels: set[int] = set()
        self._grad_list: list[torch.Tensor] = []
        self._content_hits: set[int] = set()  # tensors found to hold gradients, pre-issue
        self._bucket_ptrs: set[int] = set()  # DDP buckets handed to a Python comm hook
        self._params_cache: list[torch.Tensor] = []
        self._grad_sample: list[torch.Tensor] = []  # what _count_grads looks at
        self._params_dirty = True  # a wrapper or optimizer step since _params last ran

    def _forget_gradients(self) -> None:
        """Hold none of the job's tensors (capture is over: they must be free to go)."""
        self._params_cache, self._grad_sample = [], []
        self._grad_ptrs, self._grad_list = None, []
        self._content_hits, self._bucket_ptrs = set(), set()

    def _params(self) -> list[torch.Tensor]:
        """Parameters of the known optimizers (else of the wrapped models), cached."""
        if not self._params_dirty:
            return self._params_cache
        self._params_dirty = False
        seen: dict[int, torch.Tensor] = {}
        # a DeepSpeed engine's optimizer holds flat partitions (ZeRO 1-3): its model's
        # parameters are the ones whose gradients are the job's
        for opt in [] if self.engines else list(self.optimizers):
            for group in opt.param_groups:
                for p in group["params"]:
                    seen[id(p)] = p
        if not seen:
            modules = [*self.ddp_modules, *self.fsdp1_modules]
            modules += [e.module for e in list(self.engines)]
            modules += [m for s in list(self.fsdp_roots) for m in getattr(s, "_modules", ())]
            for module in modules:
                for p in module.parameters():
                    seen[id(p)] = p
        params = list(seen.values())
        self._params_cache = params
        self._grad_sample = params[:: max(1, -(-len(params) // _GRAD_SAMPLE))]
        return self._params_cache

    def _count_grads(self) -> int:
        """Parameters holding a gradient, among a spread sample of at most _GRAD_SAMPLE of
        them (a reset wipes them all, so a sample sees it at a cost independent of model
        size; each parameter read right after a backward is a cold memory access)."""
        if self._params_dirty:
            self._params()
        present = 0
        for p in self._grad_sample:
            if p.grad is not None:
                present += 1
        return present

    def _grads(self) -> list[torch.Tensor]:
        """The rank-local gradients of the known parameters, in parameter order (cached until
        the next backward or reset), with their storages and element counts noted."""
        if self._grad_ptrs is None:
            ptrs: set[int] = set()
            numels: set[int] = set()
            grads: list[torch.Tensor] = []
            total = 0
            for p in self._params():
                g = p.grad
                if g is None or g.is_sparse:
                    continue
                local = g.to_local() if hasattr(g, "to_local") else g
                try:
                    ptrs.add(local.untyped_storage().data_ptr())
                except Exception:
                    continue
                grads.append(local)
                numels.add(local.numel())
                total += local.numel()
            if total:
                numels.add(total)
            self._grad_ptrs, self._grad_numels, self._grad_list = ptrs, numels, grads
        return self._grad_list

    def _grad_facts(self, tensors: list[torch.Tensor]) -> tuple[bool, bool]:
        """(shares storage with a .grad or a DDP bucket handed to a comm hook, numel equals
        one grad or all grads). The numel is recorded for information only: sizes coincide
        (a 1-element loss and a bias), so it never makes a collective a grad sync."""
        self._grads()
        known = self._grad_ptrs or set()
        storage = False
        numel = False
        for t in tensors:
            with contextlib.suppress(Exception):
                ptr = t.untyped_storage().data_ptr()
                storage = storage or ptr in known or ptr in self._bucket_ptrs
            numel = numel or (t.is_floating_point() and t.numel() in self._grad_numels)
        return storage, numel

    def _grad_names(self, tensors: list[torch.Tensor]) -> dict[str, Any] | None:
        """Which parameters' gradients a user reduction sharing their storage reduces, by
        name, and whether a DDP module also reduces them (they are its parameters and not
        in its ``parameters_to_ignore``). Called only for such reductions (rare, by hand)."""
        ptrs: set[int] = set()
        for t in tensors:
            with contextlib.suppress(Exception):
                ptrs.add(t.untyped_storage().data_ptr())
        names: list[str] = []
        by_ddp = 0
        size = 0
        for module in list(self.ddp_modules):
            ignored = set(getattr(module, "parameters_to_ignore", ()) or ())
            for name, p in module.module.named_parameters():
                g = p.grad
                if g is None or g.untyped_storage().data_ptr() not in ptrs:
                    continue
                names.append(name)
                size += g.numel() * g.element_size()
                by_ddp += name not in ignored and p.requires_grad
        if not names:
            return None
        return {
            "grad_params": names[:32],
            "grad_param_count": len(names),
            "grad_param_bytes": size,
            "also_reduced_by": "ddp" if by_ddp else "",
        }

    def note_ddp_bucket(self, buffer: torch.Tensor) -> None:
        """A DDP comm hook was handed this bucket: collectives on it reduce gradients."""
        with contextlib.suppress(Exception):
            self._bucket_ptrs.add(buffer.untyped_storage().data_ptr())

    def before_collective(self, opname: str, args: tuple[Any, ...]) -> None:
        """Called before a collective runs (its input is still the rank's own): notes whether
        a user all-reduce/reduce-scatter outside backward holds the gradients' values, such
        as a flattened copy of them (``_flatten_dense_tensors``), which shares no storage."""
        if self._content_hits:
            self._content_hits = set()
        if self.bwd_depth or normalize_op(opname) not in ("all_reduce", "reduce_scatter"):
            return
        tensors = [t for t in _op_tensors(opname, args) if t.is_floating_point()]
        if not tensors:
            return
        grads = self._grads()
        if not grads:
            return
        for t in tensors:
            with contextlib.suppress(Exception):
                if holds_grads(t, grads, self._grad_ptrs or set()):
                    self._content_hits.add(t.untyped_storage().data_ptr())
