"""Bytes and durations as people read them, shared by the terminal, HTML and diff renderers
(a module of its own so the HTML report does not import rich), and ``escape_html``, which the
renderers would otherwise take from ``html``: it imports ``html.entities``, to analyze a trace
that may be 9 MiB. (``mean`` and ``median``, kept from ``statistics`` for the same reason, are
in ``syncscope.model.figures``.)"""

from __future__ import annotations


def escape_html(text: str) -> str:
    """``html.escape(text, quote=True)``."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace('"', "&quot;").replace("'", "&#x27;")


def human_bytes(n: float | None) -> str:
    """``1.5 MiB``; ``n/a`` for None (not measured)."""
    if n is None:
        return "n/a"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def bytes_unit(largest: float) -> tuple[str, int]:
    """The unit ``human_bytes`` would show ``largest`` in, and its size: (``"KiB"``, 1024).
    A chart's axis takes its unit from its largest value, so it reads as the tiles do."""
    size = 1
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(largest) < 1024 * size:
            return unit, size
        size *= 1024
    return "TiB", size


def human_ns(ns: float | None, *, whole_us: bool = False) -> str:
    """``2.50 s``, ``12.3 ms``, ``640 µs``; below 1 µs in nanoseconds (``800 ns``), or, with
    ``whole_us`` (the terminal's tables and findings), rounded to whole µs (``1 µs``);
    ``n/a`` for None (not measured)."""
    if ns is None:
        return "n/a"
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.1f} ms"
    if abs(ns) < 1e3 and not whole_us:
        return f"{ns:.0f} ns"
    return f"{ns / 1e3:.0f} µs"
