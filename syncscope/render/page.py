"""The self-contained HTML page shell shared by the run report and the diff: the stylesheet and
boot script (package data in assets/, inlined), the inlined plotly.js bundle, figure embedding
and escaping. No network fetch: a Content-Security-Policy forbids it, so a page that tried
would fail loudly in the browser test.
"""

from __future__ import annotations

import functools
import importlib.util
import pkgutil
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

import orjson

from syncscope.text import escape_html

CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data:; font-src data:"
)

# The page's own stylesheet and script are package data (syncscope/render/assets/), inlined
# into every page so that report.html stays one self-contained file.
ASSETS = "assets"
STYLESHEET = "report.css"
SCRIPT = "report.js"


@functools.cache
def asset(name: str) -> str:
    """The text of one of the page's assets, as the installed package ships it.

    Read through the package's loader (``pkgutil.get_data``, a zipped install included), the
    way ``importlib.resources`` reads it too, without the 20-100 ms that importing
    ``importlib.resources`` costs on every ``syncscope report``."""
    data = pkgutil.get_data("syncscope.render", f"{ASSETS}/{name}")
    if data is None:
        raise FileNotFoundError(f"{ASSETS}/{name} is not in the installed syncscope package")
    return data.decode("utf-8")


def esc(value: object) -> str:
    """Escape anything for HTML text or a quoted attribute."""
    return escape_html(str(value))


# what plotly's JSON encoder escapes: no "</script>" or "<!--" can end the inline JSON early,
# and no line separator can break a script
_UNSAFE_IN_SCRIPT = (
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("/", "\\u002f"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)


def _plotly_bundle() -> Path | None:
    """plotly.min.js as the installed plotly package ships it (``plotly.offline.get_plotlyjs``),
    found without importing plotly: its import alone costs more than rendering a report."""
    spec = importlib.util.find_spec("plotly")
    for folder in (spec and spec.submodule_search_locations) or ():
        bundle = Path(folder, "package_data", "plotly.min.js")
        if bundle.is_file():
            return bundle
    return None


def _copy_file(source: Path, out: IO[bytes]) -> None:
    """``source``'s bytes onto ``out`` through one reused 64 KiB buffer. (Chunks of a MiB or
    more are each a fresh allocation that glibc serves from the heap once it has freed one,
    and the process keeps those pages: 1 MiB of peak memory for nothing.)"""
    buf = bytearray(1 << 16)
    view = memoryview(buf)
    with source.open("rb") as src:
        while n := src.readinto(buf):
            out.write(view[:n])


def _plotly_js_bytes() -> bytes:
    bundle = _plotly_bundle()
    if bundle is not None:
        return bundle.read_bytes()
    data = pkgutil.get_data("plotly", "package_data/plotly.min.js")  # a zipped install
    if data is None:
        raise FileNotFoundError("plotly.min.js is not in the installed plotly package")
    return data


@functools.cache
def _plotly_js() -> str:
    return _plotly_js_bytes().decode("utf-8")


# pygments (and the entry-point scan its import makes) loads only for pages that show code.
@functools.cache
def _code_css() -> str:
    from pygments.formatters import HtmlFormatter

    return str(HtmlFormatter(style="friendly").get_style_defs(".code"))


def code_block(source: str, diff: bool = False) -> str:
    """Python source (or a unified diff of it) with syntax highlighting (pygments escapes
    the text)."""
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import DiffLexer, PythonLexer

    lexer = DiffLexer() if diff else PythonLexer()
    return str(highlight(source, lexer, HtmlFormatter(cssclass="code", style="friendly")))


def figure_json(fig: dict[str, Any]) -> str:
    """A figure (``{"data": [...], "layout": {...}}``) as JSON that is safe inside <script>."""
    data = orjson.dumps(fig).decode("utf-8")
    for unsafe, safe in _UNSAFE_IN_SCRIPT:
        if unsafe in data:
            data = data.replace(unsafe, safe)
    return data


def figure_block(fig: dict[str, Any], fig_id: str) -> str:
    """A chart container and its figure as inert JSON (``figure_json`` escapes '<' and '/')."""
    data = figure_json(fig)
    return (
        f'<div class="chart" id="{esc(fig_id)}"></div>\n'
        f'<script type="application/json" data-figure="{esc(fig_id)}">{data}</script>'
    )


def section(title: str, lead: str, body: Iterable[str], *, section_id: str = "") -> str:
    ident = f' id="{esc(section_id)}"' if section_id else ""
    lead_html = f'<p class="lead">{esc(lead)}</p>' if lead else ""
    return f"<section{ident}><h2>{esc(title)}</h2>{lead_html}\n" + "\n".join(body) + "</section>"


def _shell(title: str, body: str) -> tuple[str, str]:
    """The page before the plotly.js bundle, and after it."""
    code_css = _code_css() if '<div class="code">' in body else ""
    head = (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{esc(title)}</title>\n<style>\n{asset(STYLESHEET)}{code_css}</style>\n<script>"
    )
    tail = (
        f"</script>\n</head><body><main>\n{body}\n</main>\n"
        f"<script>\n{asset(SCRIPT)}</script>\n</body></html>\n"
    )
    return head, tail


def page(title: str, body: str) -> str:
    """One self-contained document: plotly.js inlined once, figures drawn from inline JSON."""
    head, tail = _shell(title, body)
    return head + _plotly_js() + tail


def write_page(out: IO[bytes], title: str, body: str) -> None:
    """``page(title, body)`` written to ``out``, the 4.6 MB bundle copied from its file in
    pieces rather than held as text (a page held whole costs several copies of it)."""
    head, tail = _shell(title, body)
    out.write(head.encode("utf-8"))
    bundle = _plotly_bundle()
    if bundle is None:
        out.write(_plotly_js_bytes())
    else:
        _copy_file(bundle, out)
    out.write(tail.encode("utf-8"))
