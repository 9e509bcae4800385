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

from typing import Any

Event = dict[str, Any]
Record = tuple[Any, ...]
Item = Event | Record

FIELDS: dict[str, tuple[str, ...]] = {
    "fwd": ("type", "t", "wrapper", "module", "sync", "depth", "site"),
    "bwd": ("type", "t", "sync", "site"),
    "bwd_end": ("type", "t"),
    "toggle": ("type", "t", "how", "value", "module", "site"),
    "reset": ("type", "t", "how", "set_to_none", "site"),
    "step": ("type", "t", "optimizer", "site", "mem", "cuda_peak"),
    "step_end": ("type", "t"),
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


def event_of(item: Item) -> Event:
    """The event an item stands for (an event is itself)."""
    if isinstance(item, dict):
        return item
    names = FIELDS[item[0]]
    event = dict(zip(names, item, strict=False))  # a further item follows, or none
    if len(item) > len(names):
        more = item[len(names)]
        if more is not None:
            event.update(more if type(more) is dict else more.fields())
    return event
