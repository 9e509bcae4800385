"""Text helpers every stage may import: what a user controls made safe for a terminal, and
bytes and durations as people read them.

``visible``: strings a user controls (script names, arguments, exception texts, paths, notes
and call sites read back from a run directory) with control characters shown, never sent: an
ESC[2J in a script name must not clear the screen, an OSC 0 must not set the window title.
report.html escapes its own way (``escape_html``); JSON escapes them.

``human_bytes``, ``bytes_unit``, ``human_ns``: shared by the terminal, HTML and diff
renderers and the findings' texts. ``escape_html`` is here rather than taken from ``html``,
which imports ``html.entities``, to analyze a trace that may be 9 MiB; nothing here imports
rich, so the HTML report does not. (``mean`` and ``median``, kept from ``statistics`` for the
same reason, are in ``syncscope.model.figures``.)
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, and the C1 controls (8-bit CSI, OSC, ...)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """``text`` with each control character written out (``ESC`` -> ``\\x1b``)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


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
