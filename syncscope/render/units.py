"""Bytes and durations as people read them, shared by the terminal, HTML and diff renderers
(a module of its own so the HTML report does not import rich), and the few helpers the
renderers would otherwise take from ``html`` and ``statistics``: those import ``html.entities``
and ``decimal``/``fractions``, 1 MiB between them, to analyze a trace that may be 9 MiB."""

from __future__ import annotations

import math
from collections.abc import Iterable


def escape_html(text: str) -> str:
    """``html.escape(text, quote=True)``."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace('"', "&quot;").replace("'", "&#x27;")


def mean(values: Iterable[float]) -> float:
    """``statistics.fmean`` of a non-empty iterable."""
    items = list(values)
    return math.fsum(items) / len(items)


def median(values: Iterable[float]) -> float:
    """``statistics.median`` of a non-empty iterable (the mean of the middle two when even)."""
    items = sorted(values)
    mid = len(items) // 2
    return items[mid] if len(items) % 2 else (items[mid - 1] + items[mid]) / 2


def human_bytes(n: float) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def human_ns(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.1f} ms"
    return f"{ns / 1e3:.0f} µs"
