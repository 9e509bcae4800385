"""Text for a terminal from strings a user controls (script names, arguments, exception
texts, paths, notes and call sites read back from a run directory): control characters are
shown, never sent. An ESC[2J in a script name must not clear the screen, an OSC 0 must not
set the window title. report.html escapes its own way (html.escape); JSON escapes them."""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, and the C1 controls (8-bit CSI, OSC, ...)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """``text`` with each control character written out (``ESC`` -> ``\\x1b``)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
