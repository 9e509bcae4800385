"""The recorder's optimizer steps: where windows end (a part of ``Recorder``).

An outermost ``optimizer.step()`` (or a framework's boundary step, DeepSpeed's
``engine.step()``) closes the window: its ``step`` record carries the gradient fingerprint
the ranks compare, a closure it runs (``step(closure)``: Lightning, LBFGS) is micro-batch
code of that window, and bounded capture (``--skip-windows``, ``--windows``) starts and
ends at step boundaries. ``Recorder`` inherits this class: its state is the recorder's own
attributes, set by ``_init_steps``, so the hot hooks read it with no indirection.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from typing import TYPE_CHECKING, Any

from syncscope.capture import sites
from syncscope.capture.fingerprint import PendingFingerprint, cuda_peak_and_reset, fingerprint
from syncscope.capture.paramprint import ParamPrints, PendingParams, wanted
from syncscope.capture.recorder.records import MEM_AT_WRITE, Record
from syncscope.capture.recorder.records import perf_ns as _perf_ns

_CLOSURE = {"closure": True}  # a step's further field when it runs a closure (never mutated)


class StepHooks:
    """Optimizer steps and window ends."""

    if TYPE_CHECKING:  # the recorder's, used here
        _clock_offset: int
        window: int
        micro_batch: int
        fwd_depth: int
        step_depth: int
        after_backward: bool
        trace: Any
        muted: bool
        skip_windows: int
        max_windows: int | None
        on_capture_end: Any
        optimizers: weakref.WeakSet[Any]
        _params_dirty: bool
        _framework_final: bool
        _pending_fp: list[tuple[int, PendingFingerprint]]
        _pending_pfp: list[tuple[dict[str, Any], PendingParams]]
        wrapped_modules: list[weakref.ref[Any]]
        _window_open: bool
        _window_activity: bool
        _grad_ptrs: set[int] | None
        _grads_after_backward: int

        def now(self) -> int: ...
        def emit(self, event: dict[str, Any]) -> None: ...
        def hold(self, record: Record) -> None: ...
        def note_framework(self, skip: int = 1) -> None: ...
        def _resolve_fingerprints(self, wait: bool) -> None: ...

    def _init_steps(self) -> None:
        self._group_counts: dict[int, int] = {}  # id(optimizer) -> its param groups
        self._fp_window = -1  # the window fingerprint_window last fingerprinted
        # parameter fingerprints, where the ranks' environment asks for them
        self._param_prints = ParamPrints() if wanted() else None

    def on_step_begin(
        self, optimizer: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """An optimizer step begins. With a closure (``step(closure)``: Lightning, LBFGS) the
        closure is wrapped: the forward/backward it runs belong to the window this step
        closes, and the fingerprint is taken after it returns (the gradients the update
        uses). Returns the step's new (args, kwargs) when the closure was wrapped."""
        self.step_depth += 1
        if self.step_depth > 1:
            return None
        groups = len(optimizer.param_groups)
        if self._group_counts.get(id(optimizer)) != groups:  # new, or a param group added
            self._group_counts[id(optimizer)] = groups
            self.optimizers.add(optimizer)
            self._params_dirty = True
        if not self._framework_final:
            self.note_framework(2)
            self._framework_final = True
        if self._pending_fp or self._pending_pfp:
            self._resolve_fingerprints(wait=False)
        if self._param_prints is not None:
            self._print_params(optimizer, self.window, before=True)
        # the hook sees step's own arguments: (optimizer, closure) or closure=...
        at = 1 if args and args[0] is optimizer else 0
        if kwargs and "closure" in kwargs:
            closure = kwargs["closure"]
        else:
            closure = args[at] if len(args) > at else None
        step = (
            "step",
            _perf_ns() + self._clock_offset,
            type(optimizer).__name__,
            sites.user_site(2, "step"),
            MEM_AT_WRITE,  # read off the training thread
            cuda_peak_and_reset(),
        )
        if callable(closure):
            self.hold((*step, _CLOSURE))
            wrapped = self._wrap_closure(optimizer, closure)
            kwargs = dict(kwargs or {})
            if "closure" in kwargs:
                kwargs["closure"] = wrapped
                return args, kwargs
            return (*args[:at], wrapped, *args[at + 1 :]), kwargs
        fp = fingerprint(optimizer, self.window)
        more: Any = None
        if fp is None:
            pass
        elif fp.on_host:
            more = fp  # its fields are read off the training thread (pure Python)
        elif fp.ready():
            more = fp.fields()
        else:
            more = fp.fields(value=False)  # the value follows as an ``fp`` event
            self._pending_fp.append((self.window, fp))
        self.hold((*step, more))
        return None

    def on_engine_step_begin(self, name: str) -> None:
        """A framework's step at its boundary (DeepSpeed's ``engine.step()``) begins: the
        window's step, the optimizer steps inside it nested (not windows of their own)."""
        self.step_depth += 1
        if self.step_depth > 1:
            return
        if self._pending_fp:
            self._resolve_fingerprints(wait=False)
        site = sites.user_site(2, "step")
        self.hold(
            (
                "step",
                _perf_ns() + self._clock_offset,
                name,
                site,
                MEM_AT_WRITE,
                cuda_peak_and_reset(),
                None,
            )
        )

    def fingerprint_window(self, take: Any) -> None:
        """Once per window, at its first forward: ``take(window)`` fingerprints what every rank
        must hold identical then (a DeepSpeed engine's parameters), not the gradients."""
        if self._fp_window == self.window or self.micro_batch or self.fwd_depth:
            return
        self._fp_window = self.window
        fp = None
        with contextlib.suppress(Exception):  # a record must never break the user's job
            fp = take(self.window)
        if fp is not None:
            self._pending_fp.append((self.window, fp))

    def on_engine_step_end(self) -> None:
        """The boundary step returned: the window closes."""
        self.on_step_end()

    def _wrap_closure(self, optimizer: Any, closure: Any) -> Any:
        """The closure, run as micro-batch code (phase forward/backward, not "optimizer");
        each return takes the window's fingerprint (the last one of an LBFGS step wins)."""

        @functools.wraps(closure)
        def closure_in_window(*args: Any, **kwargs: Any) -> Any:
            depth, self.step_depth = self.step_depth, 0
            self.emit({"type": "closure", "t": self.now()})
            try:
                return closure(*args, **kwargs)
            finally:
                self.step_depth = depth
                self.emit({"type": "closure_end", "t": self.now()})
                self._fingerprint_now(optimizer)

        return closure_in_window

    def _fingerprint_now(self, optimizer: Any) -> None:
        fp = fingerprint(optimizer, self.window)
        if fp is None:
            return
        if fp.ready():
            self.emit({"type": "fp", "window": self.window, **fp.fields()})
        else:
            self._pending_fp.append((self.window, fp))

    def _print_params(self, optimizer: Any, window: int, before: bool) -> None:
        """Record the fingerprints of ``optimizer``'s parameters now: ``before`` its step
        (only ahead of its first one, the parameters training starts from), else after it."""
        prints = self._param_prints
        assert prints is not None
        try:
            modules = [m for ref in self.wrapped_modules if (m := ref()) is not None]
            plan, new = prints.plan(optimizer, modules)
            if new:
                self.emit({**plan.event(optimizer), "t": self.now()})
            elif before:
                return
            pending = plan.take(initial=before)
        except Exception:  # a record must never break the user's job
            return
        if pending is None:
            return
        if pending.on_host:
            self.hold(("pfp", window, plan.key, pending))  # summed off the training thread
        else:
            self._pending_pfp.append(({"type": "pfp", "window": window, "opt": plan.key}, pending))

    def on_step_end(self, *hook_args: Any) -> None:
        """An optimizer step returned (``hook_args``: a step post-hook's (optimizer, args,
        kwargs); a framework's boundary step gives none)."""
        self.step_depth = max(0, self.step_depth - 1)
        if self.step_depth:
            return
        self.hold(("step_end", _perf_ns() + self._clock_offset))
        second = self.window > 0 and not self._window_activity
        if self._param_prints is not None and hook_args:
            self._print_params(hook_args[0], self.window - 1 if second else self.window, False)
        self._close_window()

    def on_step_skipped(self, optimizer: Any) -> None:
        """``GradScaler.step(optimizer)`` found inf/NaN gradients and did not call
        ``optimizer.step()``: the window ends here all the same (the loop goes on to
        ``zero_grad()`` and the next window), as a skipped step."""
        if self.step_depth:
            return
        self.emit(
            {
                "type": "step_skip",
                "t": self.now(),
                "optimizer": type(optimizer).__name__,
                "site": sites.user_site(2, "step_skip"),
            }
        )
        self._close_window()

    def _close_window(self) -> None:
        """The window ends at an optimizer step (taken or skipped)."""
        if self.window > 0 and not self._window_activity:
            return  # a second optimizer's step closes the same window (as the builder merges)
        if self.trace is not None and self._window_open:
            self.trace.window_end(self.window)
        self._window_open = False
        self._window_activity = False
        self.window += 1
        self.micro_batch = 0
        self.after_backward = False
        self._grad_ptrs = None
        self._grads_after_backward = -1
        if self.muted and self.window >= self.skip_windows:
            self.muted = False  # the windows from here on are the job's optimizer steps W, W+1...
            self.emit({"type": "skipped", "windows": self.window, "t": self.now()})
        elif (
            self.max_windows is not None
            and self.window >= self.skip_windows + self.max_windows
            and self.on_capture_end is not None
        ):
            self.on_capture_end()
