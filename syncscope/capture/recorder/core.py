"""The per-rank recorder: turns what the instrumentation sees into events in a sink.

The recorder keeps only the little state capture needs (which window and micro-batch we are
in, the phase, the DDP bucket order); everything else is derived later from the events by
``syncscope.load.captured``. Event kinds and fields are documented in docs/formats.md.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
import weakref
from typing import Any, Protocol

import torch

from syncscope._version import __version__
from syncscope.capture import sites
from syncscope.capture.fingerprint import (
    rss_bytes,
)
from syncscope.capture.recorder.gradients import GradientIndex, _op_tensors
from syncscope.capture.recorder.models import ModelIndex
from syncscope.capture.recorder.pending import PendingWork
from syncscope.capture.recorder.records import Item, Record, event_of, needs_mem
from syncscope.capture.recorder.records import perf_ns as _perf_ns
from syncscope.capture.recorder.registry import WrapperRegistry
from syncscope.capture.recorder.steps import StepHooks
from syncscope.model import normalize_op, reduces_gradients
from syncscope.rundir import EVENTS_FORMAT, EVENTS_FORMAT_VERSION


class Sink(Protocol):
    def write(self, event: dict[str, Any]) -> None: ...

    def buffer(self, item: Item) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class MemorySink:
    """Keeps events in a list (the in-process ``track()`` API); records held by hot hooks
    become events when ``events`` is read."""

    def __init__(self) -> None:
        self._items: list[Item] = []
        self._lock = threading.Lock()

    def write(self, event: Item) -> None:
        with self._lock:
            self._items.append(event)

    buffer = write

    @property
    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            items = self._items
            mem = rss_bytes() if needs_mem(items) else 0
            for i, item in enumerate(items):
                if type(item) is not dict:
                    items[i] = event_of(item, mem)
            return items  # type: ignore[return-value]  # every item is an event now

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class TraceHooks(Protocol):
    """What ``--trace`` needs to hear about (see syncscope.capture.profiler.ProfilerTrace)."""

    def window_begin(self, index: int) -> None: ...
    def micro_batch_begin(self, window: int, micro_batch: int) -> None: ...
    def micro_batch_end(self, window: int, micro_batch: int) -> None: ...
    def grad_sync(self, op: str, nbytes: int) -> None: ...
    def window_end(self, index: int) -> None: ...
    def close(self) -> None: ...


# what a window is made of: not written while windows are skipped (``--skip-windows``)
_WINDOW_EVENTS = frozenset(
    (
        "fwd",
        "bwd",
        "bwd_end",
        "reset",
        "toggle",
        "coll",
        "done",
        "step",
        "step_end",
        "step_skip",
        "fp",
        "pfp",
    )
)

# Events written at once (``EventWriter.write``): the rare ones, the header and the exit
# record. Every other event (the per-micro-batch, per-collective and per-step ones) is held
# in memory and written by the writer's flusher thread within ``FLUSH_INTERVAL_S``, or with
# the next written event; held events also go to disk before a blocking collective is
# issued. A rank stopped by a signal or an exception writes everything; one killed outright
# (SIGKILL, a segfault) loses at most its last flush interval of events.
_AT_ONCE = frozenset(
    ("header", "exit", "wrapper", "dist", "framework", "warning", "skipped", "bwd_error")
)


_dtype_names: dict[torch.dtype, str] = {}  # torch.float32 -> "float32"


def _dtype_name(dtype: torch.dtype) -> str:
    name = _dtype_names.get(dtype)
    if name is None:
        name = _dtype_names[dtype] = str(dtype).replace("torch.", "")
    return name


def _payload(tensors: list[torch.Tensor]) -> tuple[int, str, bool]:
    """A collective's (bytes, dtype name, all floating point)."""
    if len(tensors) == 1:  # the common case, without a generator's frame per figure
        first = tensors[0]
        return (
            first.numel() * first.element_size(),
            _dtype_name(first.dtype),
            first.is_floating_point(),
        )
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    dtype = _dtype_name(tensors[0].dtype) if tensors else ""
    return nbytes, dtype, bool(tensors) and all(t.is_floating_point() for t in tensors)


class Recorder(WrapperRegistry, GradientIndex, ModelIndex, PendingWork, StepHooks):
    """Receives callbacks from the instrumentation and writes events for one rank.

    In parts, by concern: this class is the window/phase state machine and holds the
    events; ``WrapperRegistry`` (``syncscope.capture.recorder.registry``) the wrappers and their
    sync state, ``GradientIndex`` (``syncscope.capture.recorder.gradients``) the gradient index and
    content probe, ``PendingWork`` (``syncscope.capture.recorder.pending``) the collectives in flight
    and pending fingerprints, ``StepHooks`` (``syncscope.capture.recorder.steps``) the optimizer
    steps that end windows. The parts are base classes, not objects of their own: the hot
    hooks read every part's state as the recorder's attributes, with no indirection."""

    sink: Sink

    def __init__(
        self,
        sink: Sink,
        *,
        rank: int,
        world_size: int,
        local_rank: int = 0,
        trace: TraceHooks | None = None,
        skip_windows: int = 0,
        max_windows: int | None = None,
    ) -> None:
        self.sink = sink
        # a blocking collective's record goes to disk before its call (``call``): a backend
        # that aborts the process inside the call (gloo on a size mismatch) cannot take it
        self.calls_on_disk = not isinstance(sink, MemorySink)
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.trace = trace
        # wall-clock nanoseconds = the monotonic counter + this offset, fixed at the start
        self._clock_offset = time.time_ns() - time.perf_counter_ns()
        self._lock = threading.RLock()
        self.window = 0
        self.micro_batch = 0  # backward passes completed in the current window
        self.fwd_depth = 0
        self.bwd_depth = 0
        self.step_depth = 0
        self.after_backward = False
        self.bucket = 0
        self.seq = 0
        self._window_open = False
        self._closed = False
        self._init_wrappers()
        self._init_gradients()
        self._init_models()
        self._init_pending()
        self._init_steps()
        self._window_activity = False  # a backward, collective or reset since the last step
        # bounded capture: skip the first windows, stop after max_windows captured ones
        self.skip_windows = skip_windows
        self.max_windows = max_windows
        self.muted = skip_windows > 0  # window events are not written while skipping
        self.on_capture_end: Any = None  # called at the end of the last captured window
        self.uninstall: Any = None  # set by instrument.install
        self.detaching = False  # capture is over: hooks go at their next safe call
        _LIVE.add(self)  # made inert in a forked child (_inert_in_children)

    # -- plumbing -------------------------------------------------------------------------
    def now(self) -> int:
        """Wall-clock nanoseconds, from the monotonic counter."""
        return _perf_ns() + self._clock_offset

    def emit(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if self._closed or (self.muted and kind in _WINDOW_EVENTS):
            return
        if self._works and kind != "coll":
            self.poll_works()
        if kind in _AT_ONCE:
            self.sink.write(event)
        else:
            self.sink.buffer(event)

    def hold(self, record: Record) -> None:
        """Hold a hot hook's record (see ``syncscope.capture.recorder.records``): a window event,
        never written at once, made into its event off the training thread."""
        if self._closed or self.muted:
            return
        if self._works and record[0] != "coll":
            self.poll_works()
        self.sink.buffer(record)

    def flush(self) -> None:
        """Put held events on disk (before a blocking collective: a rank that hangs in its
        call has told everything up to it)."""
        self.sink.flush()

    @property
    def listening(self) -> bool:
        """False while windows are skipped and once capture is over (collectives ignored)."""
        return not (self.muted or self._closed)

    def detach_now(self) -> None:
        """Remove every hook (called from a hook that is not iterated over by torch)."""
        self.detaching = False
        undo, self.uninstall = self.uninstall, None
        if undo is not None:
            undo()

    def header(self, extra: dict[str, Any]) -> None:
        self.emit(
            {
                "type": "header",
                "format": EVENTS_FORMAT,
                "version": EVENTS_FORMAT_VERSION,
                "rank": self.rank,
                "local_rank": self.local_rank,
                "world_size": self.world_size,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "t": self.now(),
                "syncscope": __version__,
                "torch": torch.__version__,
                "python": sys.version.split()[0],
                **extra,
            }
        )

    def footer(self, status: int | None, reason: str) -> None:
        if self._closed:
            return
        self._resolve_fingerprints(wait=True)
        self.poll_works()
        self._works = []
        self._note_dist()
        self.emit(
            {
                "type": "exit",
                "t": self.now(),
                "status": status,
                "reason": reason,
                "dist_initialized": bool(self.dist_info),
                **self.dist_info,
            }
        )
        if self.trace is not None:
            self.trace.close()
        self._closed = True
        # hold nothing of the job's once closed: its tensors and works must be free to go
        self._pending_fp = []
        self._pending_pfp = []
        self._forget_gradients()
        self._forget_models()

    # -- forward ----------------------------------------------------------------------------
    def _window_begin(self) -> None:
        if not self._window_open:
            self._window_open = True
            if self.trace is not None:
                self.trace.window_begin(self.window)

    def on_forward_begin(
        self, wrapper: str, label: str, sync: bool | None, extra: dict[str, Any] | None = None
    ) -> None:
        depth = self.fwd_depth
        self.fwd_depth += 1
        if not torch.is_grad_enabled():
            return
        if depth == 0:
            if not self._window_open:  # a call only at a window's first forward
                self._window_begin()
            if self.trace is not None:
                self.trace.micro_batch_begin(self.window, self.micro_batch)
        site = sites.user_site(2, "fwd")
        if depth == 0 and site is not None and site["function"] == "forward":
            # the wrapper runs inside the user's own module: what encloses that module's call
            within = sites.within_outside_forward(2)
            if within:
                extra = {**(extra or {}), "within": within}
        self.hold(
            ("fwd", _perf_ns() + self._clock_offset, wrapper, label, sync, depth, site, extra)
        )

    def on_forward_end(self) -> None:
        """A wrapper forward returned: only the phase changes. No event is written (earlier
        versions wrote ``fwd_end``, which nothing derived from a run reads)."""
        self.fwd_depth = max(0, self.fwd_depth - 1)

    # -- backward -------------------------------------------------------------------------
    def on_backward_begin(self) -> bool:
        """Returns True for an outermost backward (the one that counts as a micro-batch)."""
        self.bwd_depth += 1
        if self.bwd_depth > 1:
            return False
        if not self._window_open:
            self._window_begin()
        if self.micro_batch > 0 and not self._reset_since_backward and not self._grads_freed:
            present = self._count_grads()
            if 0 <= present < self._grads_after_backward:
                self.emit(
                    {
                        "type": "reset",
                        "t": self.now(),
                        "how": "grad=None",
                        "site": None,
                        "sampled_params": self._grads_after_backward - present,
                    }
                )
        self.bucket = 0
        if self._bucket_ptrs:
            self._bucket_ptrs = set()
        self._window_activity = True
        self._model_grads = self.model_grad_state()  # several models: whose grads change
        self.hold(
            ("bwd", _perf_ns() + self._clock_offset, self.sync_state(), sites.user_site(2, "bwd"))
        )
        if self.fwd_depth == 0 and self.trace is not None:
            self.trace.micro_batch_begin(self.window, self.micro_batch)
        return True

    def on_backward_end(self, outermost: bool) -> None:
        self.bwd_depth = max(0, self.bwd_depth - 1)
        if not outermost:
            return
        if self._model_grads is None:
            self.hold(("bwd_end", _perf_ns() + self._clock_offset))
        else:  # several models: which of them this backward gave gradients to
            changed = self.models_with_new_grads()
            self.hold(("bwd_end", _perf_ns() + self._clock_offset, {"grads_of": changed}))
            self._model_grads = None
        if self.trace is not None:
            self.trace.micro_batch_end(self.window, self.micro_batch)
        if self.micro_batch == 0:
            # counted after a window's first backward only: the next backwards compare
            # against it (a count per backward doubled the cold reads right after each)
            self._grads_after_backward = self._count_grads()
        self.micro_batch += 1
        self.after_backward = True
        self._reset_since_backward = False
        self._grad_ptrs = None

    def on_grad_reset(self, how: str, set_to_none: bool | None) -> None:
        self._reset_since_backward = True
        if self.micro_batch or self.bwd_depth:
            self._window_activity = True
        self._grad_ptrs = None
        self.hold(
            (
                "reset",
                _perf_ns() + self._clock_offset,
                how,
                set_to_none,
                sites.user_site(2, "reset"),
            )
        )

    def on_toggle(
        self, how: str | None, value: bool, label: str, extra: dict[str, Any] | None = None
    ) -> None:
        """A sync flag was set. ``how`` None: DDP's ``require_backward_grad_sync``, set by
        ``no_sync`` when a frame of it is among the setter's few callers. ``extra``: further
        fields of the event (an FSDP setter's ``recurse=False``)."""
        if how is None:
            site, in_no_sync = sites.user_site_through(2, "no_sync", 4, "toggle")
            how = "no_sync" if in_no_sync else "require_backward_grad_sync"
        else:
            site = sites.user_site(1)
        record = ("toggle", _perf_ns() + self._clock_offset, how, bool(value), label, site)
        self.hold(record if extra is None else (*record, extra))

    # -- collectives --------------------------------------------------------------------------
    def phase(self) -> str:
        if self.step_depth:
            return "optimizer"
        if self.bwd_depth:
            return "backward"
        if self.fwd_depth:
            return "forward"
        if self.after_backward:
            return "after-backward"
        return "other"

    def _user_grad_facts(self, tensors: list[torch.Tensor]) -> tuple[bool, bool, bool]:
        """(grad_storage, grad_numel, grad_content) of a user all-reduce/reduce-scatter."""
        grad_storage, grad_numel = self._grad_facts(tensors)
        grad_content = False
        if not grad_storage and self._content_hits:
            with contextlib.suppress(Exception):
                grad_content = any(
                    t.untyped_storage().data_ptr() in self._content_hits for t in tensors
                )
        return grad_storage, grad_numel, grad_content

    def _reduction_facts(
        self, issuer: str, tensors: list[torch.Tensor], grad_storage: bool
    ) -> dict[str, Any] | None:
        """Rare reductions, described further: FSDP reducing outside autograd (what drove
        it: a pipelining schedule after the step's last backward; the stack is walked only
        here), and a user reduction of the gradients (which, and who else reduces them: for
        a flat copy, DDP when a DDP module ignores none of its parameters)."""
        if issuer == "fsdp":
            via = sites.driver_of_collective(3)
            return {"via": via} if via else None
        if grad_storage:
            return self._grad_names(tensors)
        ddps = list(self.ddp_modules)
        whole = ddps and not any(getattr(m, "parameters_to_ignore", None) for m in ddps)
        return {"also_reduced_by": "ddp" if whole else ""}

    def on_collective(
        self,
        opname: str,
        args: tuple[Any, ...],
        pg: Any,
        work: Any,
        t0: int,
        t1: int,
        tensors: list[torch.Tensor] | None = None,
        kind: str = "coll",
    ) -> Record:
        """``tensors``: the payload, where it is not found in ``args`` by the c10d layout
        (the functional collectives take their input first). ``kind`` "call": the record of
        a blocking collective about to be called (``collective_returned`` follows it)."""
        if not self.dist_info:
            self._note_dist()
        if self._works:
            self.poll_works(at=t0)  # a synchronous predecessor finished before this issue
        op = normalize_op(opname)
        if tensors is None:
            tensors = _op_tensors(opname, args)
        if op == "barrier":
            tensors = []
        nbytes, dtype, floating = _payload(tensors)
        issuer, site, detail = sites.issuer_of_collective(2)
        phase = self.phase()
        bucket: int | None = None
        if issuer == "autograd":
            issuer = "ddp" if phase == "backward" and self.ddp_modules else "torch"
        if issuer == "ddp" and phase == "backward" and op == "all_reduce" and floating:
            # a gradient bucket; DDP's integer used-parameter map (find_unused_parameters)
            # is bookkeeping, not a bucket
            bucket = self.bucket
            self.bucket += 1
        grad_storage = grad_numel = grad_content = False
        if issuer == "user" and op in ("all_reduce", "reduce_scatter"):
            grad_storage, grad_numel, grad_content = self._user_grad_facts(tensors)
        if self._content_hits:
            self._content_hits = set()
        group_name = self._group_ranks(pg)[0] if pg is not None else ""
        with self._lock:
            seq = self.seq
            self.seq += 1
        self._window_activity = True
        rare = (issuer == "fsdp" and phase != "backward") or (
            issuer == "user" and (grad_storage or grad_content)
        )
        extra = self._reduction_facts(issuer, tensors, grad_storage) if rare else None
        if issuer == "fsdp" and op in ("reduce_scatter", "all_reduce"):
            model = self.fsdp_model_of_reduction(1)  # several models: whose gradients
            if model:
                extra = {**(extra or {}), "model": model}
        record = (
            kind,
            seq,
            t0,
            t1,
            op,
            opname,
            nbytes,
            dtype,
            group_name,
            phase,
            issuer,
            detail,
            bucket,
            grad_storage,
            grad_content,
            grad_numel,
            site,
            extra,
        )
        self.hold(record)
        if self.trace is not None and reduces_gradients(
            op, issuer, phase, floating, grad_storage, grad_content
        ):
            self.trace.grad_sync(op, nbytes)
        if work is not None:
            self._watch(work, seq)
        return record

    def collective_returned(self, called: Record, work: Any, t0: int, t1: int) -> None:
        """A blocking collective's call returned: its ``coll`` record, the ``call`` record
        written before it with the call's own times (``t0`` when it was entered, ``t1`` when
        it returned)."""
        self.hold(("coll", called[1], t0, t1, *called[4:]))
        if work is not None:
            self._watch(work, called[1])


_LIVE: weakref.WeakSet[Recorder] = weakref.WeakSet()  # every recorder not yet collected


def _inert_in_children() -> None:
    """In a process the rank forks (a multiprocessing pool worker) the hooks it inherits
    record nothing and reach no profiler: the child is not the rank, and the profiler's
    state was copied from the rank mid-use (its locks possibly held). Registered once, not
    per recorder: ``track()`` makes a recorder per block and fork handlers cannot be removed."""
    for rec in list(_LIVE):
        rec.trace = None
        rec._closed = True
        rec._works, rec._pending_fp, rec._pending_pfp = [], [], []


os.register_at_fork(after_in_child=_inert_in_children)
