"""Compact records: what a hot hook keeps of its event on the training thread.

A hook that runs several times per micro-batch (a forward, a backward, a sync-flag toggle,
a collective, a step) does not build its event's dictionary. It holds a *record*: a tuple
whose first item is the event's kind and whose items follow ``FIELDS[kind]``, optionally
followed by one more item with further fields (a dict, or an object with a ``fields()``
method, such as a CPU gradient fingerprint). The event writer's flusher thread (or the
in-memory sink, when its events are read) turns records into events with ``event_of``.

Why: right after a backward, nothing of syncscope is in the CPU's caches, and each line a
hook runs costs about a microsecond. Building an event dict touches every key's string
object; a tuple touches none. The event written is the same either way (same keys, same
order, same values): the run-directory format does not know about records.
"""

from __future__ import annotations

import time
from typing import Any

# The recorders' clock: a record's time is this counter plus the recorder's offset
# (``Recorder.now``). The hot hooks call it by this name, not through ``now`` (a Python frame).
perf_ns = time.perf_counter_ns

Event = dict[str, Any]
Record = tuple[Any, ...]
Item = Event | Record


class _MemAtWrite:
    """A ``step`` record's ``mem`` when the hook did not read it: the rank process's
    resident set size is read where the record becomes its event (the writer's flusher, once
    per drain), not on the training thread (a read of /proc cost ~25 us per step there)."""

    def __repr__(self) -> str:
        return "MEM_AT_WRITE"


MEM_AT_WRITE = _MemAtWrite()
_MEM = 4  # the index of ``mem`` in a step record

FIELDS: dict[str, tuple[str, ...]] = {
    "fwd": ("type", "t", "wrapper", "module", "sync", "depth", "site"),
    "bwd": ("type", "t", "sync", "site"),
    "bwd_end": ("type", "t"),
    "toggle": ("type", "t", "how", "value", "module", "site"),
    "reset": ("type", "t", "how", "set_to_none", "site"),
    "step": ("type", "t", "optimizer", "site", "mem", "cuda_peak"),
    "step_end": ("type", "t"),
    "pfp": ("type", "window", "opt"),
    "coll": (
        "type",
        "seq",
        "t",
        "t_end",
        "op",
        "raw",
        "bytes",
        "dtype",
        "pg",
        "phase",
        "issuer",
        "detail",
        "bucket",
        "grad_storage",
        "grad_content",
        "grad_numel",
        "site",
    ),
    "done": ("type", "seq", "t"),
}
# a blocking collective's record written before its call: the ``coll`` record's fields
FIELDS["call"] = FIELDS["coll"]


def _maker(names: tuple[str, ...]) -> Any:
    """A function that makes a record's event: ``{"type": r[0], "t": r[1], ...}``, one dict
    display of the record's items named in order. Written out, as ``dataclasses`` writes
    ``__init__``: on the flusher thread of the small-step MLP, with the two makers alternating
    drains in one run, 1.0-1.15 us an event against ``dict(zip(names, record))``'s 1.6-1.7."""
    items = ", ".join(f"{name!r}: r[{i}]" for i, name in enumerate(names))
    namespace: dict[str, Any] = {}
    exec(f"def event(r):\n    return {{{items}}}\n", namespace)  # FIELDS names only
    return namespace["event"]


# kind -> (its event maker, the number of its named items)
_MAKERS: dict[str, tuple[Any, int]] = {
    kind: (_maker(names), len(names)) for kind, names in FIELDS.items()
}


def needs_mem(items: list[Item]) -> bool:
    """Whether some of ``items`` is a step record whose ``mem`` is read when written."""
    return any(type(i) is tuple and i[0] == "step" and i[_MEM] is MEM_AT_WRITE for i in items)


def event_of(item: Item, mem: int = 0) -> Event:
    """The event an item stands for (an event is itself); ``mem``: the resident set size
    read for a step record that holds ``MEM_AT_WRITE``."""
    if isinstance(item, dict):
        return item
    kind = item[0]
    make, width = _MAKERS[kind]
    if len(item) < width:  # never made so: named as far as it goes
        event: Event = dict(zip(FIELDS[kind], item, strict=False))
    else:
        event = make(item)
    if kind == "step" and event.get("mem") is MEM_AT_WRITE:
        event["mem"] = mem
    if len(item) > width:
        more = item[width]
        if more is not None:
            event.update(more if type(more) is dict else more.fields())
    return event
