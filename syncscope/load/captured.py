"""Build one rank's model from its captured events: windows cut from a capture.

``rank_from_events(events)`` turns one rank's event list into a ``RankRun``;
``load.runs`` reads run directories and makes the ``Run`` from the ranks. Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from syncscope.load.params import param_prints
from syncscope.model import (
    Collective,
    GradReset,
    MicroBatch,
    ParamPrint,
    PendingCollective,
    RankRun,
    SourceLocation,
    SyncToggle,
    Window,
    Wrapper,
    WrapperInfo,
    reduces_gradients,
)


def _site(value: Any) -> SourceLocation | None:
    if not isinstance(value, dict) or "file" not in value:
        return None
    return SourceLocation(
        str(value["file"]), int(value.get("line", 0)), str(value.get("function", ""))
    )


def _withs(site: object, within: object) -> dict[tuple[str, int], str]:
    """(file, line) -> call, of the ``with`` statements recorded around a site."""
    file = str(site.get("file", "")) if isinstance(site, dict) else ""
    out: dict[tuple[str, int], str] = {}
    for entry in within if isinstance(within, list) else ():
        if isinstance(entry, dict) and isinstance(entry.get("line"), int):
            key = (str(entry.get("file") or file), int(entry["line"]))
            out[key] = str(entry.get("call", ""))
    return out


def _helpers(fwd: dict[str, Any], backward: dict[str, Any]) -> tuple[SourceLocation, ...]:
    """The user's ``with`` statements around both a micro-batch's forward and backward
    (``fwd["within"]``: around the user's module that called the wrapper)."""
    fsite, bsite = fwd.get("site"), backward.get("site")
    if not isinstance(fsite, dict) or not isinstance(bsite, dict):
        return ()
    around_forward = _withs(fsite, fwd.get("within") or fsite.get("within"))
    around_backward = _withs(bsite, bsite.get("within"))
    return tuple(
        SourceLocation(file, line, call)
        for (file, line), call in around_backward.items()
        if (file, line) in around_forward
    )


def is_floating_dtype(dtype: str) -> bool:
    """Gradients are floating point; "" (not recorded) is given the benefit of the doubt."""
    return dtype == "" or "float" in dtype.lower()


def is_grad_sync(event: dict[str, Any]) -> bool:
    """A captured collective reduces gradients (``syncscope.model.reduces_gradients``).
    Events written before ``grad_content`` existed (same format version) carry only
    ``grad_numel``, the size test those captures used; it is honoured for them alone."""
    grad_content = event.get("grad_content")
    if "grad_content" not in event:
        grad_content = event.get("grad_numel")  # older captures
    return reduces_gradients(
        str(event.get("op")),
        str(event.get("issuer")),
        str(event.get("phase")),
        is_floating_dtype(str(event.get("dtype", ""))),
        bool(event.get("grad_storage")),
        bool(grad_content),
    )


class _WindowBuilder:
    """Accumulates one window's pieces while events stream by."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.start_ns: int | None = None
        self.micro_batches: list[MicroBatch] = []
        self.collectives: list[Collective] = []
        self.resets: list[GradReset] = []
        self.toggles: list[SyncToggle] = []
        self.peak_memory = 0
        self.fingerprint: tuple[float, ...] | None = None
        self.fp_sharded = False
        self.step_site: SourceLocation | None = None
        self.step_start = 0
        self.dropped = 0

    def touch(self, t: int) -> None:
        if self.start_ns is None:
            self.start_ns = t

    def empty(self) -> bool:
        return not (self.micro_batches or self.collectives or self.resets)

    def build(
        self,
        end_ns: int,
        complete: bool,
        step_ns: int = 0,
        params: tuple[ParamPrint, ...] = (),
        skipped: bool = False,
    ) -> Window:
        start = self.start_ns if self.start_ns is not None else end_ns
        return Window(
            index=self.index,
            complete=complete,
            start_ns=start,
            end_ns=max(start, end_ns),
            micro_batches=tuple(self.micro_batches),
            collectives=tuple(self.collectives),
            grad_resets=tuple(self.resets),
            toggles=tuple(self.toggles),
            step_site=self.step_site,
            step_ns=step_ns,
            peak_memory_bytes=self.peak_memory,
            fingerprint=self.fingerprint,
            fingerprint_sharded=self.fp_sharded,
            records_dropped=self.dropped,
            params=params,
            step_skipped=skipped,
        )


class _RankReader:
    """One rank's state while its events stream by, in the order written: ``feed`` hands
    each event to the handler of its kind (``_HANDLERS``), ``finish`` makes the RankRun."""

    def __init__(self, events: Sequence[dict[str, Any]]) -> None:
        self.done = {e["seq"]: int(e["t"]) for e in events if e.get("type") == "done"}
        # fingerprints written after their step began (CUDA, or after a step's closure ran):
        # the last one of a window is what the update used (an LBFGS step runs its closure often)
        self.late_fp = {e["window"]: e for e in events if e.get("type") == "fp"}
        self.param_prints, self.initial_params = param_prints(events)
        self.cuda = any(e.get("type") == "step" and e.get("cuda_peak") for e in events)
        self.header: dict[str, Any] = {}
        self.footer: dict[str, Any] | None = None
        self.framework: dict[str, Any] = {}
        self.wrappers: list[WrapperInfo] = []
        self.windows: list[Window] = []
        self.pending_ops: dict[int, PendingCollective] = {}
        self.last_completed: PendingCollective | None = None
        self.first_window = 0  # optimizer steps skipped before capture (``--skip-windows``)
        self.current = _WindowBuilder(0)
        self.pending_fwd: dict[str, Any] | None = None
        self.backward: dict[str, Any] | None = None
        self.no_sync_active = False
        self.no_sync_at_forward = False
        self.armed: list[str] = []  # DDP models armed at forward since the last backward
        self.dist_seen = False
        self.backward_failed = False
        self.closure_start: int | None = None
        self.closure_ns = 0
        self.last_t = 0
        self.groups: dict[str, tuple[int, ...] | None] = {}  # ``pg`` events: name -> ranks

    def feed(self, ev: dict[str, Any]) -> None:
        kind = ev.get("type")
        t = int(ev.get("t", self.last_t) or self.last_t)
        self.last_t = max(self.last_t, t)
        handler = _HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is not None:
            handler(self, ev, t)

    def _on_dropped(self, ev: dict[str, Any], t: int) -> None:
        self.current.dropped += 1

    def _on_header(self, ev: dict[str, Any], t: int) -> None:
        self.header = ev

    def _on_dist(self, ev: dict[str, Any], t: int) -> None:
        self.dist_seen = True

    def _on_framework(self, ev: dict[str, Any], t: int) -> None:
        self.framework = ev

    def _on_exit(self, ev: dict[str, Any], t: int) -> None:
        self.footer = ev

    def _on_closure(self, ev: dict[str, Any], t: int) -> None:
        self.closure_start = t

    def _on_closure_end(self, ev: dict[str, Any], t: int) -> None:
        if self.closure_start is not None:
            self.closure_ns += max(0, t - self.closure_start)  # micro-batch work, not the step's
            self.closure_start = None

    def _on_skipped(self, ev: dict[str, Any], t: int) -> None:
        self.first_window = int(ev.get("windows", 0) or 0)
        self.current = _WindowBuilder(self.first_window + len(self.windows))

    def _on_wrapper(self, ev: dict[str, Any], t: int) -> None:
        self.wrappers.append(
            WrapperInfo(
                kind=ev.get("kind", "none"),
                label=str(ev.get("label", "")),
                param_count=int(ev.get("params", 0) or 0),
                param_bytes=int(ev.get("param_bytes", 0) or 0),
                shard_world=int(ev.get("shard_world", 1) or 1),
                bucket_cap_bytes=ev.get("bucket_cap_bytes"),
                site=_site(ev.get("site")),
                zero_stage=ev.get("zero_stage"),
                accumulation_steps=ev.get("accumulation_steps"),
                static_graph=ev.get("static_graph") is True,
                outer=str(ev.get("outer", "") or ""),
                fsdp_modules=_names(ev.get("fsdp_modules")),
                setter_sites=tuple(
                    site
                    for value in _list(ev.get("setter_mentions"))
                    if (site := _site(value)) is not None
                ),
            )
        )

    def _on_forward(self, ev: dict[str, Any], t: int) -> None:
        if ev.get("wrapper") == "ddp" and ev.get("sync") is True:
            label = str(ev.get("module", ""))
            if label and label not in self.armed:
                self.armed.append(label)
        if int(ev.get("depth", 0)) == 0:
            self.current.touch(t)
            self.pending_fwd = ev
            self.no_sync_at_forward = self.no_sync_active

    def _on_toggle(self, ev: dict[str, Any], t: int) -> None:
        if ev.get("how") == "no_sync":
            self.no_sync_active = not ev.get("value", True)
        self.current.toggles.append(
            SyncToggle(
                how=str(ev.get("how", "")),
                value=bool(ev.get("value")),
                micro_batch=len(self.current.micro_batches),
                before_forward=self.pending_fwd is None and self.backward is None,
                site=_site(ev.get("site")),
                recurse=ev.get("recurse") is not False,
                module=str(ev.get("module", "") or ""),
            )
        )

    def _on_backward(self, ev: dict[str, Any], t: int) -> None:
        self.current.touch(t)
        self.backward = ev

    def _on_backward_error(self, ev: dict[str, Any], t: int) -> None:
        self.backward_failed = True

    def _on_backward_end(self, ev: dict[str, Any], t: int) -> None:
        if self.backward_failed:
            self.backward_failed = False  # raised: still "in backward", no micro-batch done
        elif self.backward is not None:
            mb = self._micro_batch(self.backward, t)
            grads_of = ev.get("grads_of")
            if isinstance(grads_of, list):
                mb = dataclasses.replace(mb, grads_of=tuple(str(label) for label in grads_of))
            self.current.micro_batches.append(mb)
            self.armed = []
            memory = int(ev.get("mem", 0) or 0)
            self.current.peak_memory = max(self.current.peak_memory, memory)
            self.pending_fwd = None
            self.backward = None

    def _micro_batch(self, backward: dict[str, Any], end_ns: int) -> MicroBatch:
        """The micro-batch a backward pass that just ended completes."""
        fwd = self.pending_fwd or {}
        sync_states = list((backward.get("sync") or {}).values())
        accel = fwd.get("accelerate") or {}
        return MicroBatch(
            index=len(self.current.micro_batches),
            start_ns=int(fwd.get("t", backward["t"])),
            end_ns=end_ns,
            wrapper=_wrapper(fwd.get("wrapper") if fwd else _default_wrapper(self.wrappers)),
            forward_sync=fwd.get("sync") if fwd else None,
            backward_sync=all(sync_states) if sync_states else None,
            in_no_sync_at_forward=self.no_sync_at_forward if fwd else False,
            in_no_sync_at_backward=self.no_sync_active,
            forward_site=_site(fwd.get("site")),
            backward_site=_site(backward.get("site")),
            sync_each_batch=accel.get("sync_each_batch") if accel else None,
            backward_start_ns=int(backward["t"]),
            helpers=_helpers(fwd, backward),
            armed=tuple(self.armed),
        )

    def _on_reset(self, ev: dict[str, Any], t: int) -> None:
        if self.current.micro_batches or self.backward is not None:
            self.current.resets.append(
                GradReset(
                    after_micro_batches=len(self.current.micro_batches),
                    how=str(ev.get("how", "")),
                    site=_site(ev.get("site")),
                )
            )

    def _on_collective(self, ev: dict[str, Any], t: int) -> None:
        current = self.current
        if self.windows or current.micro_batches or self.pending_fwd or self.backward:
            current.touch(t)  # set-up collectives (DDP's init broadcasts) start no window
        position = _position(str(ev.get("phase", "other")), len(current.micro_batches))
        group = _group(ev["group"]) if "group" in ev else self.groups.get(str(ev.get("pg", "")))
        coll = _collective(ev, group, position, self.done.get(ev["seq"]))
        if coll.issuer == "ddp" and coll.grad_sync and coll.phase == "backward":
            # the DDP model whose forward armed its reducer; several armed: not told apart
            armed = self.armed[0] if len(self.armed) == 1 else ""
            coll = dataclasses.replace(coll, module=armed, model=armed)
        current.collectives.append(coll)
        summary = PendingCollective(
            seq=coll.seq,
            op=coll.op,
            bytes=coll.bytes,
            group_ranks=coll.group_ranks,
            start_ns=coll.start_ns,
            window=current.index,
            micro_batch=position,
            phase=coll.phase,
        )
        last = self.last_completed
        if coll.done_ns is None:
            self.pending_ops[coll.seq] = summary
        elif last is None or coll.done_ns >= self.done.get(last.seq, 0):
            self.last_completed = summary

    def _on_group(self, ev: dict[str, Any], t: int) -> None:
        self.groups[str(ev.get("pg", ""))] = _group(ev.get("group"))

    def _on_step(self, ev: dict[str, Any], t: int) -> None:
        current = self.current
        current.touch(t)
        current.step_site = _site(ev.get("site"))
        current.step_start = t
        memory = int(ev.get("cuda_peak", 0) or 0) or int(ev.get("mem", 0) or 0)
        current.peak_memory = max(current.peak_memory, memory)
        if ev.get("fp") is not None:
            current.fingerprint = tuple(float(v) for v in ev["fp"])
        current.fp_sharded = bool(ev.get("fp_sharded", False))

    def _on_step_skip(self, ev: dict[str, Any], t: int) -> None:
        """GradScaler skipped ``optimizer.step()``: the window ends, with no update."""
        current = self.current
        current.touch(t)
        current.step_site = _site(ev.get("site"))
        if current.empty() and self.windows:  # another optimizer of the same window
            previous = self.windows[-1]
            self.windows[-1] = dataclasses.replace(previous, steps=previous.steps + 1, end_ns=t)
        else:
            self.windows.append(current.build(t, True, 0, skipped=True))
        self.current = _WindowBuilder(self.first_window + len(self.windows))
        self.no_sync_at_forward = False

    def _on_step_end(self, ev: dict[str, Any], t: int) -> None:
        current = self.current
        late = self.late_fp.get(current.index)
        if current.fingerprint is None and late is not None:
            current.fingerprint = tuple(float(v) for v in late["fp"])
            current.fp_sharded = bool(late.get("fp_sharded", current.fp_sharded))
        step_ns = 0
        if current.step_start:
            step_ns = max(0, t - current.step_start - self.closure_ns)
        self.closure_ns = 0
        windows = self.windows
        if current.empty() and windows:  # another optimizer's step closes the same window
            previous = windows[-1]
            windows[-1] = dataclasses.replace(
                previous, steps=previous.steps + 1, end_ns=t, step_ns=previous.step_ns + step_ns
            )
        else:
            params = tuple(self.param_prints.get(current.index, {}).values())
            windows.append(current.build(t, True, step_ns, params))
        self.current = _WindowBuilder(self.first_window + len(windows))
        self.no_sync_at_forward = False

    def _in_progress(self) -> str:
        """What the rank was inside at its last event ("" between micro-batches)."""
        if self.backward is not None:
            return "backward"
        if self.pending_fwd is not None:
            return "forward"
        return "optimizer.step" if self.current.step_start else ""

    def finish(self, rank: int | None) -> RankRun:
        windows = list(self.windows)
        if not self.current.empty() or self.current.dropped:  # lines it held were dropped
            windows.append(self.current.build(self.last_t, False))
        footer, header = self.footer, self.header
        status = footer.get("status") if footer else None
        dist_initialized = self.dist_seen or (
            bool(footer.get("dist_initialized")) if footer else True
        )
        return RankRun(
            rank=int(header.get("rank", rank if rank is not None else 0)),
            windows=tuple(windows),
            local_rank=int(header.get("local_rank", 0)),
            host=str(header.get("host", "")),
            pid=int(header.get("pid", 0)),
            device="cuda" if self.cuda else "cpu",
            wrappers=tuple(self.wrappers),
            finished=footer is not None,
            exit_status=int(status) if isinstance(status, int) else None,
            exit_reason=str(footer.get("reason", ""))
            if footer
            else "no exit record (killed or hung)",
            last_event_ns=self.last_t,
            in_progress=self._in_progress(),
            last_completed=self.last_completed,
            pending=tuple(self.pending_ops.values()),
            dist_initialized=dist_initialized,
            backend=str(footer.get("backend", "")) if footer else "",
            framework=str(self.framework.get("name", "")),
            framework_version=str(self.framework.get("version", "")),
            zero_stage=self.framework.get("zero_stage"),
            initial_params=tuple(self.initial_params.values()),
        )


_Handler = Callable[[_RankReader, dict[str, Any], int], None]
_HANDLERS: dict[str, _Handler] = {
    "header": _RankReader._on_header,
    "dropped": _RankReader._on_dropped,
    "dist": _RankReader._on_dist,
    "framework": _RankReader._on_framework,
    "exit": _RankReader._on_exit,
    "closure": _RankReader._on_closure,
    "closure_end": _RankReader._on_closure_end,
    "skipped": _RankReader._on_skipped,
    "wrapper": _RankReader._on_wrapper,
    "fwd": _RankReader._on_forward,
    "toggle": _RankReader._on_toggle,
    "bwd": _RankReader._on_backward,
    "bwd_error": _RankReader._on_backward_error,
    "bwd_end": _RankReader._on_backward_end,
    "reset": _RankReader._on_reset,
    "coll": _RankReader._on_collective,
    "pg": _RankReader._on_group,
    "step": _RankReader._on_step,
    "step_end": _RankReader._on_step_end,
    "step_skip": _RankReader._on_step_skip,
}


def rank_from_events(events: Sequence[dict[str, Any]], rank: int | None = None) -> RankRun:
    """One rank's events, in the order written, to its windows (``rank``: when no header
    says which rank wrote them)."""
    reader = _RankReader(events)
    for ev in events:
        reader.feed(ev)
    return reader.finish(rank)


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _names(value: object) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _wrapper(value: object) -> Wrapper:
    return value if value in ("ddp", "fsdp", "deepspeed") else "none"  # type: ignore[return-value]


def _default_wrapper(wrappers: list[WrapperInfo]) -> str:
    return wrappers[0].kind if wrappers else "none"


def _position(phase: str, completed: int) -> int:
    """Micro-batch position of a collective, given backward passes completed in the window."""
    if phase in ("forward", "backward"):
        return completed
    return max(completed - 1, 0)


_GROUPS: dict[tuple[int, ...], tuple[int, ...]] = {}  # one tuple per distinct group


def _group(value: object) -> tuple[int, ...] | None:
    """A group's ranks as one tuple shared by every collective and rank that names it: a
    16k-rank job's ranks all hold the same 16k-entry tuple, not one each."""
    if not isinstance(value, list):
        return None
    ranks = tuple(value)  # validated: integers (checked at C speed, as the reader's input)
    if not set(map(type, ranks)) <= {int}:
        ranks = tuple(int(r) for r in value)
    if len(_GROUPS) > 4096:  # a bound, should a process read runs with many groups
        _GROUPS.clear()
    return _GROUPS.setdefault(ranks, ranks)


def _collective(
    ev: dict[str, Any], group: tuple[int, ...] | None, position: int, done_ns: int | None
) -> Collective:
    return Collective(
        seq=int(ev["seq"]),
        op=str(ev.get("op", "other")),
        raw_op=str(ev.get("raw", "")),
        bytes=int(ev.get("bytes", 0) or 0),
        dtype=str(ev.get("dtype", "")),
        group_ranks=group,
        group_name=str(ev.get("pg", "")),
        start_ns=int(ev["t"]),
        end_ns=int(ev.get("t_end", ev["t"])),
        done_ns=done_ns,
        phase=ev.get("phase", "other"),
        micro_batch=position,
        grad_sync=is_grad_sync(ev),
        issuer=ev.get("issuer", "torch")
        if ev.get("issuer") in ("ddp", "fsdp", "deepspeed", "user")
        else "torch",
        bucket=ev.get("bucket"),
        module=str(ev.get("detail", "")),
        model=str(ev.get("model", "") or ""),
        site=_site(ev.get("site")),
        via=str(ev.get("via", "") or ""),
        grad_params=_names(ev.get("grad_params")),
        also_reduced_by=str(ev.get("also_reduced_by", "") or ""),
    )
