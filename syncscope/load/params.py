"""A rank's parameter fingerprints, from its ``params`` and ``pfp`` events (recorded where
the ranks' environment asked for them: ``syncscope fix --verify``). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from syncscope.model import ParamPrint


def param_prints(
    events: Sequence[dict[str, Any]],
) -> tuple[dict[int, dict[str, ParamPrint]], dict[str, ParamPrint]]:
    """The parameter fingerprints of a rank's ``params`` and ``pfp`` events: per window,
    name -> fingerprint after its step(s) (the last one of a name wins), and those taken
    before each optimizer's first step. A ``pfp`` of an optimizer no ``params`` event named
    is left out."""
    named: dict[Any, tuple[list[Any], list[Any]]] = {}
    after: dict[int, dict[str, ParamPrint]] = {}
    initial: dict[str, ParamPrint] = {}
    for ev in events:
        kind = ev.get("type")
        if kind == "params":
            named[ev.get("opt")] = (_items(ev.get("names")), _items(ev.get("dtypes")))
        elif kind == "pfp" and ev.get("opt") in named and isinstance(ev.get("window"), int):
            names, dtypes = named[ev.get("opt")]
            values, scales = _items(ev.get("values")), _items(ev.get("scales"))
            into = initial if ev.get("initial") else after.setdefault(ev["window"], {})
            for i, name in enumerate(names):
                into[str(name)] = ParamPrint(
                    str(name),
                    _number(values[i] if i < len(values) else None),
                    _number(scales[i] if i < len(scales) else None),
                    str(dtypes[i]) if i < len(dtypes) else "",
                )
    return after, initial


def _number(value: object) -> float:
    """A recorded float; NaN for one that was not finite (written as null) or not there."""
    return float(value) if isinstance(value, (int, float)) else float("nan")


def _items(value: object) -> list[Any]:
    return value if isinstance(value, list) else []
