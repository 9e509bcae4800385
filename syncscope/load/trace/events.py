"""Keep what matters from one rank's Kineto events, in compact form, as they stream by.

``decode_events`` turns a piece of the ``traceEvents`` array into ``Event`` objects that hold
only the keys read here: msgspec skips every other key without building it, which is most of
the cost of parsing a trace into dicts. ``RankEvents`` is the consumer given to
``read_trace``: it looks at each event once and keeps optimizer steps, forward markers,
backward activity, collectives (``c10d::*`` ops and ``record_param_comms``), syncscope's own
annotations and the intervals needed for overlap (GPU kernels, or CPU ops), dropping
everything else. Times are nanoseconds on the trace's own clock; ``windows.py`` adds
``baseTimeNanoseconds``.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import compress
from typing import Any

import msgspec
import orjson

from syncscope.model import input_argument

# Forward markers: DDP and FSDP1 wrap forward in a record_function; FSDP2 marks the root's
# pre-forward; syncscope marks micro-batches itself.
FORWARD_MARKERS = frozenset(
    {
        "DistributedDataParallel.forward",
        "FullyShardedDataParallel.forward",
        "FSDP::root_pre_forward",
    }
)
_FSDP_REDUCE = "FSDP::post_backward_reduce"
_BACKWARD = "autograd::engine::evaluate_function:"
# GradScaler.update(): once per window, also where GradScaler.step() skipped optimizer.step()
_SCALE_UPDATE = "aten::_amp_update_scale"
_NOT_COMPUTE = (
    "c10d::",
    "record_param_comms",
    "autograd::engine",
    "ProfilerStep",
    "Optimizer.",
    _SCALE_UPDATE,
)
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "unsigned int": 4,
    "double": 8, "float64": 8, "long": 8, "long int": 8, "int64": 8, "complexfloat": 8,
    "half": 2, "c10::half": 2, "bfloat16": 2, "c10::bfloat16": 2, "short": 2, "int16": 2,
    "byte": 1, "char": 1, "bool": 1, "unsigned char": 1, "signed char": 1, "int8": 1, "uint8": 1,
    "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}  # fmt: skip
_COMM_NAMES = ("c10d::", "record_param_comms", "gloo:", "nccl:", "syncscope.grad_sync#")
_LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
_MAX_NS = 1 << 62  # a timestamp beyond this (ns; year 2116) is corrupt, not a time


# values made Python ints at a time, where a pass runs over a list of them (several times
# faster than over an array's memoryview): a few MiB, whatever the size of the trace
PART = 1 << 16


def in_order(values: Sequence[int]) -> bool:
    """Whether ``values`` never decrease: passes in C over lists of at most ``PART`` of them
    (an array's values become objects a part at a time)."""
    last: int | None = None
    for items in parts(values):
        if items != sorted(items) or (last is not None and items[0] < last):
            return False
        last = items[-1]
    return True


def parts(values: Sequence[int]) -> Iterator[list[int]]:
    """``values`` as lists of at most ``PART`` of them, in turn (a list that fits: as it is)."""
    whole = len(values) <= PART
    for i in range(0, len(values), PART):
        part = values if whole else values[i : i + PART]
        if isinstance(part, list):
            yield part
        elif isinstance(part, array | memoryview):
            yield part.tolist()
        else:
            yield list(part)


def dtype_bytes(dtype: str) -> int | None:
    return _DTYPE_BYTES.get(dtype.lower())


_ABSENT = msgspec.Raw()  # a list key the event does not have


class Args(msgspec.Struct, gc=False):
    """The ``args`` keys read here. Lists are kept as their JSON text (``msgspec.Raw``, parsed
    by ``json_value`` for the few events that need them): every CPU op has ``Input Dims``.
    (Read through plain JSON, those keys hold their parsed values.)"""

    correlation: Any = None
    input_dims: msgspec.Raw = msgspec.field(default=_ABSENT, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_ABSENT, name="Input type")
    in_msg_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    dtype: Any = ""
    collective_name: Any = msgspec.field(default="", name="Collective name")
    group_ranks: msgspec.Raw = msgspec.field(default=_ABSENT, name="Process Group Ranks")
    group_name: Any = msgspec.field(default="", name="Process Group Name")


class Event(msgspec.Struct, gc=False):
    """One trace event, as far as it is read here (the defaults: what a missing key means).
    The fields in the order Kineto writes the keys: msgspec looks for each key from the
    field after the last one found (in another order, decoding takes 3-7% longer)."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = 0
    ts: Any = None
    dur: Any = 0
    args: Args | None = None


_decode = msgspec.json.Decoder(list[Event]).decode


def decode_events(piece: bytes) -> list[Any]:
    """The entries of the JSON array ``piece``: ``Event``s, or, where an entry is not an
    object or a key holds what no event has (``args`` not an object, a number beyond a
    double), the entries parsed as plain JSON, objects made ``Event``s and the rest left as
    they are (``RankEvents`` counts them). Invalid JSON: ``ValueError``."""
    try:
        return _decode(piece)
    except (msgspec.ValidationError, RecursionError):  # (msgspec: nesting past Python's limit)
        return [_event_of(e) for e in orjson.loads(piece)]


def _event_of(e: Any) -> Any:
    if not isinstance(e, dict):
        return e
    args = e.get("args")
    if isinstance(args, dict):
        args = Args(
            correlation=args.get("correlation"),
            input_dims=args.get("Input Dims", _ABSENT),  # parsed already: json_value keeps it
            input_type=args.get("Input type", _ABSENT),
            in_msg_nelems=args.get("In msg nelems"),
            dtype=args.get("dtype", ""),
            collective_name=args.get("Collective name", ""),
            group_ranks=args.get("Process Group Ranks", _ABSENT),
            group_name=args.get("Process Group Name", ""),
        )
    return Event(
        ph=e.get("ph"),
        cat=e.get("cat"),
        name=e.get("name"),
        pid=e.get("pid"),
        tid=e.get("tid", 0),
        ts=e.get("ts"),
        dur=e.get("dur", 0),
        args=args,
    )


_NO_ARGS = Args()  # an event without args (never written to)


def json_value(raw: Any) -> Any:
    """A key kept as its JSON text, parsed (None where the event does not have it, or where
    it nests too deep to read); a value parsed already (plain JSON's path) as it is."""
    if not isinstance(raw, msgspec.Raw):
        return raw
    if not raw:
        return None
    try:
        return msgspec.json.decode(raw)
    except RecursionError:
        return None


@dataclass(slots=True)
class Span:
    start: int
    end: int
    tid: int
    name: str


@dataclass(slots=True)
class RawCollective:
    """A c10d op (or, where there are none, a record_param_comms or backend annotation)."""

    start: int
    end: int
    tid: int
    name: str
    nelems: int | None = None
    dtype: str = ""
    group_ranks: tuple[int, ...] | None = None
    group_name: str = ""
    done: int | None = None


def _parse_ranks(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    if isinstance(value, str) and value.startswith("["):
        try:
            parsed = orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
        if isinstance(parsed, list) and parsed:
            return tuple(int(v) for v in parsed)
    return None


def _first_tensor(dims: Any, index: int) -> int | None:
    """Element count of argument ``index`` of ``Input Dims`` (first tensor of a list)."""
    if not isinstance(dims, list) or len(dims) <= index:
        return None
    shape = dims[index]
    while isinstance(shape, list) and shape and isinstance(shape[0], list):
        shape = shape[0]
    if not isinstance(shape, list) or not shape:
        return None
    count = 1
    for d in shape:
        count *= int(d)
    return count


# What an event's name makes it, looked up once per distinct name (a trace repeats a few
# hundred names over millions of events): a CPU op is compute, backward activity or one to
# read further (``RankEvents._cpu``); a kernel is compute, communication or a copy.
_COMPUTE, _BACKWARD_OP, _OTHER, _COMM, _COPY = range(5)
_KINDS_MAX = 1 << 14  # names remembered per kind of event (past it: judged each time)
_CPU_KINDS: dict[str, int] = {}
_KERNEL_KINDS: dict[str, int] = {}


def _cpu_kind(name: str) -> int:
    if not name.startswith(_NOT_COMPUTE):  # (backward ops start with one)
        kind = _COMPUTE
    elif name.startswith(_BACKWARD):
        kind = _BACKWARD_OP
    else:
        kind = _OTHER
    if len(_CPU_KINDS) < _KINDS_MAX:
        _CPU_KINDS[name] = kind
    return kind


def _kernel_kind(name: Any) -> int:
    if not isinstance(name, str):
        return _kernel_kind_of("" if name is None else str(name))
    kind = _kernel_kind_of(name)
    if len(_KERNEL_KINDS) < _KINDS_MAX:
        _KERNEL_KINDS[name] = kind
    return kind


def _kernel_kind_of(name: str) -> int:
    if "nccl" in name and (
        name.startswith("nccl") or "ncclKernel" in name or "ncclDevKernel" in name
    ):
        return _COMM
    return _COPY if name.startswith(("Memcpy", "Memset")) else _COMPUTE


@dataclass
class RankEvents:
    """What one rank's trace says, reduced to what the window builder needs."""

    steps: list[Span] = field(default_factory=list)
    zero_grads: list[Span] = field(default_factory=list)
    forwards: list[Span] = field(default_factory=list)
    fsdp_reduces: list[Span] = field(default_factory=list)
    window_marks: list[Span] = field(default_factory=list)
    micro_marks: list[Span] = field(default_factory=list)
    grad_marks: list[Span] = field(default_factory=list)
    profiler_steps: list[Span] = field(default_factory=list)
    scale_updates: list[Span] = field(default_factory=list)  # GradScaler.update() calls
    collectives: list[RawCollective] = field(default_factory=list)
    param_comms: list[RawCollective] = field(default_factory=list)
    backend_comms: list[RawCollective] = field(default_factory=list)
    backward: array[int] = field(default_factory=lambda: array("q"))  # start, end pairs
    cpu_compute: array[int] = field(default_factory=lambda: array("q"))
    comm_kernels: array[int] = field(default_factory=lambda: array("q"))  # start, end, corr
    compute_kernels: array[int] = field(default_factory=lambda: array("q"))  # start, end pairs
    # kernel launches (CUDA runtime/driver calls): correlation ids, and their times as the
    # trace writes them (us), made ns only for the few that launched a communication kernel
    launch_ids: array[int] = field(default_factory=lambda: array("q"))
    launch_times: array[float] = field(default_factory=lambda: array("d"))
    pid: int | None = None
    events: int = 0
    not_objects: int = 0  # entries of traceEvents that are not objects
    unplaced: int = 0  # events without a usable timestamp (missing, not finite, dur < 0)
    unplaced_comms: int = 0  # ... of them, collectives (their rank's syncs cannot be counted)
    # times (ns) of events whose name is not a string: what they were cannot be told, so
    # the window each fell in draws no finding (``Window.records_dropped``)
    unnamed: array[int] = field(default_factory=lambda: array("q"))

    def _unplaced(self, e: Event) -> None:
        self.unplaced += 1
        name = e.name
        if isinstance(name, str) and name.startswith(_COMM_NAMES):
            self.unplaced_comms += 1

    def extent(self, backward: Sequence[tuple[int, int]]) -> tuple[int, int] | None:
        """First and last CPU-side time seen (ns), None for a trace without CPU events.
        ``backward``: the backward ops merged (``merge_pairs(self.backward)``: sorted and
        apart, so the first starts first and the last ends last)."""
        starts: list[int] = []
        ends: list[int] = []
        if self.cpu_compute:
            starts.append(min(self.cpu_compute[0::2]))
            ends.append(max(self.cpu_compute[1::2]))
        if backward:
            starts.append(backward[0][0])
            ends.append(backward[-1][1])
        for spans in (self.steps, self.forwards, self.collectives, self.window_marks):
            if spans:
                starts.append(min(s.start for s in spans))
                ends.append(max(s.end for s in spans))
        return (min(starts), max(ends)) if starts else None

    def __call__(self, batch: list[Any]) -> None:
        """Read a batch of ``decode_events``' entries (``Event``s, and any that were not
        objects)."""
        # The hot loop: one pass, locals only, no call per event for the common cases
        # (compute/comm kernels, their launches, plain CPU ops). Everything else is rare.
        # Times go in with ``append`` (an ``extend`` of a tuple costs twice as much); a
        # record cut short by a failed append is dropped by ``_whole_records``.
        self.events += len(batch)
        comm_kernels = self.comm_kernels.append
        compute_kernels = self.compute_kernels.append
        launch_ids = self.launch_ids.append
        launch_times = self.launch_times.append
        cpu_compute = self.cpu_compute.append
        backward = self.backward.append
        cpu_kinds = _CPU_KINDS
        kernel_kinds = _KERNEL_KINDS
        for e in batch:
            try:
                cat = e.cat
            except AttributeError:  # not an object
                self.not_objects += 1
                continue
            if cat is None or e.ph != "X":
                continue
            try:
                if cat == "cpu_op":
                    name = e.name
                    kind = cpu_kinds.get(name) if type(name) is str else _OTHER
                    if kind is None:
                        kind = _cpu_kind(name)
                    if kind == _COMPUTE:
                        start = int(e.ts * 1000.0)
                        end = start + int(e.dur * 1000.0)
                        cpu_compute(start)
                        cpu_compute(end)
                    elif kind == _BACKWARD_OP:
                        start = int(e.ts * 1000.0)
                        end = start + int(e.dur * 1000.0)
                        backward(start)
                        backward(end)
                    else:
                        self._cpu(e)
                elif cat == "kernel":
                    start = int(e.ts * 1000.0)
                    end = start + int(e.dur * 1000.0)
                    name = e.name
                    kind = kernel_kinds.get(name) if type(name) is str else None
                    if kind is None:
                        kind = _kernel_kind(name)
                    if kind == _COMPUTE:
                        compute_kernels(start)
                        compute_kernels(end)
                    elif kind == _COMM:
                        args = e.args
                        corr = args.correlation if args is not None else None
                        corr = -1 if corr is None else int(corr)
                        comm_kernels(start)
                        comm_kernels(end)
                        comm_kernels(corr)
                elif cat in _LAUNCH_CATEGORIES:
                    args = e.args
                    corr = args.correlation if args is not None else None
                    if corr is not None:
                        launch_times(e.ts)
                        launch_ids(corr if type(corr) is int else int(corr))
                elif cat == "user_annotation":
                    self._cpu(e)
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
                self._whole_records()
                self._unplaced(e)  # an event without a usable ts/dur is not one we can place

    def _whole_records(self) -> None:
        """Drop what a failed ``append`` left of a record (a time or correlation id too large
        for 64 bits fails after the fields before it went in): every array keeps whole
        records, so no later interval is shifted."""
        for pairs in (self.cpu_compute, self.backward, self.compute_kernels):
            del pairs[len(pairs) - len(pairs) % 2 :]
        del self.launch_times[len(self.launch_ids) :]
        triples = self.comm_kernels
        del triples[len(triples) - len(triples) % 3 :]

    def comm_launches(self) -> dict[int, int]:
        """Launch time (ns) of each communication kernel, by correlation id (where an id
        was launched twice, the later launch)."""
        wanted = set(self.comm_kernels[2::3])
        if not wanted:
            return {}
        ids = self.launch_ids
        times = self.launch_times
        if in_order(ids):  # (as traces list launches) each found by bisection
            found: dict[int, int] = {}
            for c in wanted:
                i = bisect_right(ids, c) - 1
                if i >= 0 and ids[i] == c:
                    found[c] = int(times[i] * 1000.0)
            return found
        chosen = compress(zip(ids, times, strict=True), map(wanted.__contains__, ids))
        return {c: int(ts * 1000.0) for c, ts in chosen}

    def _cpu(self, e: Event) -> None:
        name = e.name
        if not isinstance(name, str):
            self.unnamed.append(int(e.ts * 1000.0))
            return
        start = int(e.ts * 1000.0)
        end = start + int(e.dur * 1000.0)
        if end < start or not -_MAX_NS < start < _MAX_NS:
            raise ValueError("negative duration or a time outside any run")
        if name.startswith(_BACKWARD):
            self.backward.append(start)
            self.backward.append(end)
            return
        if name.startswith(_SCALE_UPDATE):
            self.scale_updates.append(Span(start, end, 0, name))
            return
        if e.cat == "cpu_op" and not name.startswith(_NOT_COMPUTE):
            self.cpu_compute.append(start)
            self.cpu_compute.append(end)
            return
        tid = e.tid if isinstance(e.tid, int) else hash(e.tid)
        if self.pid is None and isinstance(e.pid, int):
            self.pid = e.pid
        if name.startswith("c10d::"):
            self.collectives.append(self._c10d(e, start, end, tid, name))
            return
        if name == "record_param_comms":
            self.param_comms.append(self._param_comms(e, start, end, tid))
            return
        if e.cat == "cpu_op":
            return
        self._annotation(name, Span(start, end, tid, name))

    def _annotation(self, name: str, span: Span) -> None:
        if name.startswith("Optimizer.step#"):
            self.steps.append(span)
        elif name.startswith("Optimizer.zero_grad#"):
            self.zero_grads.append(span)
        elif name in FORWARD_MARKERS:
            self.forwards.append(span)
        elif name.startswith(_FSDP_REDUCE):
            self.fsdp_reduces.append(span)
        elif name.startswith("syncscope."):
            if name.startswith("syncscope.micro_batch#"):
                self.micro_marks.append(span)
            elif name.startswith("syncscope.window#"):
                self.window_marks.append(span)
            elif name.startswith("syncscope.grad_sync#"):
                self.grad_marks.append(span)
        elif name.startswith(("gloo:", "nccl:")):
            self.backend_comms.append(RawCollective(span.start, span.end, span.tid, name))
        elif name.startswith("ProfilerStep#"):
            self.profiler_steps.append(span)

    @staticmethod
    def _c10d(e: Event, start: int, end: int, tid: int, name: str) -> RawCollective:
        raw = RawCollective(start, end, tid, name)
        if e.args is None:
            return raw
        index = input_argument(name)
        raw.nelems = _first_tensor(json_value(e.args.input_dims), index)
        types = json_value(e.args.input_type)
        if isinstance(types, list) and len(types) > index and isinstance(types[index], str):
            raw.dtype = types[index] if dtype_bytes(types[index]) else ""
        return raw

    @staticmethod
    def _param_comms(e: Event, start: int, end: int, tid: int) -> RawCollective:
        args = e.args if e.args is not None else _NO_ARGS
        raw = RawCollective(start, end, tid, str(args.collective_name))
        nelems = args.in_msg_nelems
        raw.nelems = int(nelems) if isinstance(nelems, (int, float)) else None
        raw.dtype = str(args.dtype)
        raw.group_ranks = _parse_ranks(json_value(args.group_ranks))
        raw.group_name = str(args.group_name)
        return raw
