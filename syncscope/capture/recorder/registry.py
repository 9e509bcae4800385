"""The recorder's registry of wrappers and their sync state (a part of ``Recorder``).

DDP modules, FSDP2 roots, FSDP1 modules and DeepSpeed engines, labelled in order of
creation; the framework driving the job; the process groups and the default group's facts
(written once each). ``sync_state`` reads every live wrapper's sync intent at each backward.
``Recorder`` inherits this class: its state is the recorder's own attributes, set by
``_init_wrappers``, so the hot hooks read it with no indirection.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import TYPE_CHECKING, Any

import torch

from syncscope.capture.frameworks import FRAMEWORKS, detect_framework
from syncscope.capture.recorder.gradients import deepspeed_reduce_grads, fsdp_reduce_grads

_WRAPPER_ORDER = ("ddp", "fsdp2", "fsdp1", "deepspeed")  # the order of a backward's ``sync`` state


class WrapperRegistry:
    """Wrappers, optimizers, framework and process groups the recorder has seen."""

    if TYPE_CHECKING:  # the recorder's, used here
        _params_dirty: bool
        _grads_freed: bool

        def now(self) -> int: ...
        def emit(self, event: dict[str, Any]) -> None: ...

    def _init_wrappers(self) -> None:
        self.ddp_modules: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self.fsdp_roots: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self.fsdp1_modules: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self.engines: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        # (kind, weak reference, label) of every wrapper: what sync_state reads per backward
        self._wrappers: list[tuple[str, weakref.ref[Any], str]] = []
        # id(DDP module) -> (weak reference, label): what the hot wrappers read (a plain
        # dict's lookup; ``ddp_modules.get`` is a Python call and a weak reference each)
        self.ddp_labels: dict[int, tuple[weakref.ref[Any], str]] = {}
        self._sync_dicts: dict[bool, dict[str, bool]] = {}  # sync_state's, one DDP module
        self.optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
        # the modules wrapped, in order: where parameter fingerprints find their names
        self.wrapped_modules: list[weakref.ref[Any]] = []
        self._labels = 0
        self.framework: tuple[str, str] | None = None
        self._framework_final = False
        self._pg_cache: dict[str, list[int] | None] = {}
        self.dist_info: dict[str, Any] = {}

    def _note_dist(self) -> None:
        """Remember the default group while it exists (scripts often destroy it at the end)."""
        if self.dist_info:
            return
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            self.dist_info = {
                "backend": str(dist.get_backend()),
                "world_size": dist.get_world_size(),
                "rank": dist.get_rank(),
            }

    def new_label(self, kind: str, module: Any) -> str:
        self._labels += 1
        inner = getattr(module, "module", module)
        return f"{kind}:{type(inner).__name__}#{self._labels - 1}"

    def on_dist_init(self) -> None:
        self._note_dist()
        if self.dist_info:
            self.emit({"type": "dist", "t": self.now(), **self.dist_info})

    def on_wrapper(
        self, kind: str, module: Any, info: dict[str, Any], key: Any | None = None
    ) -> str:
        """Register a DDP module (key: the module) or FSDP2 root (key: its FSDPState)."""
        self._note_dist()
        self.note_framework(2)
        label = self.new_label(kind, module)
        with contextlib.suppress(TypeError):  # a module without weak references: unnamed
            self.wrapped_modules.append(weakref.ref(module))
        if kind == "ddp":
            self.ddp_modules[module] = label
            self._wrappers.append(("ddp", weakref.ref(module), label))
            self.ddp_labels[id(module)] = (self._wrappers[-1][1], label)
        elif key is None:
            self.fsdp1_modules[module] = label  # FSDP1: the module holds the sync flag
            self._wrappers.append(("fsdp1", weakref.ref(module), label))
        else:
            self.fsdp_roots[key] = label  # FSDP2: keyed by the root's FSDPState
            self._wrappers.append(("fsdp2", weakref.ref(key), label))
        self._wrappers.sort(key=lambda w: _WRAPPER_ORDER.index(w[0]))  # stable: by creation
        self._params_dirty = True
        self.emit({"type": "wrapper", "kind": kind, "label": label, "t": self.now(), **info})
        return label

    def on_engine(self, engine: Any, info: dict[str, Any], version: str) -> str:
        """Register a DeepSpeed engine (see ``syncscope.capture.hooks.deepspeed_engine``): a wrapper, and
        the framework, with its ZeRO stage, whatever runs it (Accelerate, the HF Trainer)."""
        self._note_dist()
        label = self.new_label("deepspeed", engine)
        self.engines[engine] = label
        self._wrappers.append(("deepspeed", weakref.ref(engine), label))
        self._wrappers.sort(key=lambda w: _WRAPPER_ORDER.index(w[0]))
        self._params_dirty = True
        stage = int(info.get("zero_stage", 0) or 0)
        self._grads_freed = self._grads_freed or stage >= 2
        self.emit({"type": "wrapper", "kind": "deepspeed", "label": label, "t": self.now(), **info})
        if version or self.framework is None:
            self.framework, self._framework_final = ("deepspeed", version), True
            self.emit(
                {
                    "type": "framework",
                    "t": self.now(),
                    "name": "deepspeed",
                    "version": version,
                    "zero_stage": stage,
                }
            )
        return label

    def note_framework(self, skip: int = 1) -> None:
        """Record the framework driving the job (Lightning, HF Trainer, Accelerate), as seen
        from the stack at a wrapper's creation and at the first optimizer step."""
        if self._framework_final:
            return
        found: tuple[str, str] | None = None
        with contextlib.suppress(Exception):  # a record must never break the user's job
            found = detect_framework(skip + 1)
        if found is None or found == self.framework:
            return
        if self.framework is not None and [n for n, _, _ in FRAMEWORKS].index(found[0]) > [
            n for n, _, _ in FRAMEWORKS
        ].index(self.framework[0]):
            return  # keep the more specific one seen first
        self.framework = found
        self.emit({"type": "framework", "t": self.now(), "name": found[0], "version": found[1]})

    def sync_state(self) -> dict[str, bool]:
        """Each live wrapper's sync intent now: DDP modules, FSDP2 roots, FSDP1 modules (in
        that order: ``_wrappers`` is kept sorted by kind). With one DDP module (the common
        case) one of two dicts made once is returned (events are never mutated)."""
        wrappers = self._wrappers
        if len(wrappers) == 1 and wrappers[0][0] == "ddp":
            ddp = wrappers[0][1]()
            if ddp is not None:
                flag = bool(ddp.require_backward_grad_sync)
                cached = self._sync_dicts.get(flag)
                if cached is None or wrappers[0][2] not in cached:
                    cached = self._sync_dicts[flag] = {wrappers[0][2]: flag}
                return cached
        state: dict[str, bool] = {}
        for kind, ref, label in self._wrappers:
            obj = ref()
            if obj is None:
                continue
            if kind == "ddp":
                state[label] = bool(obj.require_backward_grad_sync)
            elif kind == "fsdp2":
                state[label] = fsdp_reduce_grads(obj)
            elif kind == "deepspeed":
                state[label] = deepspeed_reduce_grads(obj)
            else:
                state[label] = bool(getattr(obj, "_sync_gradients", True))
        return state

    def _group_ranks(self, pg: Any) -> tuple[str, list[int] | None]:
        name = str(getattr(pg, "group_name", "") or "")
        if name in self._pg_cache:
            return name, self._pg_cache[name]
        ranks: list[int] | None
        try:
            ranks = list(torch.distributed.get_process_group_ranks(pg))
        except Exception:
            ranks = None
        self._pg_cache[name] = ranks
        # the group's ranks, written once: its collectives name it by ``pg`` (a group of
        # the whole job on every collective made a 16k-rank run's files grow as world size
        # squared)
        self.emit({"type": "pg", "t": self.now(), "pg": name, "group": ranks})
        return name, ranks
