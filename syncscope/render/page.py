"""The self-contained HTML page shell shared by the run report and the diff: CSS, the inlined
plotly.js bundle, figure embedding and escaping. No network fetch: a Content-Security-Policy
forbids it, so a page that tried would fail loudly in the browser test.
"""

from __future__ import annotations

import functools
import importlib.util
import pkgutil
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

import orjson

from syncscope.render.units import escape_html

CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data:; font-src data:"
)

CSS = """
:root { --ink:#1f2933; --muted:#616e7c; --line:#e4e7eb; --bg:#f5f7fa; --card:#fff;
  --ok:#2f9e6e; --ok-bg:#e6f5ee; --warn:#b7791f; --warn-bg:#fdf3e1; --err:#c53030; --err-bg:#fdecec;
  --info:#3b6fd1; --info-bg:#e8effb; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink);
  font:15px/1.55 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif; }
main { max-width:1180px; margin:0 auto; padding:28px 28px 64px; }
code, pre, .mono { font-family:ui-monospace,"SF Mono",Menlo,Consolas,"DejaVu Sans Mono",monospace;
  font-size:13px; }
header.top { display:flex; align-items:baseline; gap:14px; flex-wrap:wrap; margin-bottom:6px; }
header.top .brand { font-weight:700; letter-spacing:.02em; font-size:18px; }
header.top .cmd { color:var(--muted); overflow-wrap:anywhere; }
.meta { color:var(--muted); font-size:13px; margin:0 0 18px; }
.meta span + span::before { content:"·"; margin:0 8px; color:#b0b8c1; }
.verdict { border-radius:12px; padding:22px 26px; margin:0 0 18px; border-left:6px solid; }
.verdict h1 { margin:0 0 4px; font-size:24px; line-height:1.25; }
.verdict p { margin:0; font-size:16px; }
.verdict.clean { background:var(--ok-bg); border-color:var(--ok); }
.verdict.warnings { background:var(--warn-bg); border-color:var(--warn); }
.verdict.errors { background:var(--err-bg); border-color:var(--err); }
.verdict.failed { background:var(--err); border-color:#7f1d1d; color:#fff; }
.tiles { display:grid; grid-template-columns:repeat(auto-fit,minmax(170px,1fr)); gap:12px; margin:0 0 28px; }
.tile { background:var(--card); border:1px solid var(--line); border-radius:10px; padding:14px 16px; }
.tile .label { color:var(--muted); font-size:12px; text-transform:uppercase; letter-spacing:.06em; }
.tile .value { font-size:24px; font-weight:650; margin-top:2px; font-variant-numeric:tabular-nums;
  white-space:nowrap; }
.tile .value small { font-size:14px; font-weight:500; color:var(--muted); }
.tile .sub { color:var(--muted); font-size:13px; }
.tile.bad .value { color:var(--err); } .tile.warn .value { color:var(--warn); }
.tile.good .value { color:var(--ok); }
section { margin:0 0 30px; }
section > h2 { font-size:18px; margin:0 0 4px; }
section > p.lead { color:var(--muted); margin:0 0 12px; }
.chart { background:var(--card); border:1px solid var(--line); border-radius:10px; padding:6px 0;
  margin:0 0 14px; min-height:120px; overflow:hidden; }
.card { background:var(--card); border:1px solid var(--line); border-radius:10px; padding:18px 22px;
  margin:0 0 14px; border-top:4px solid var(--line); }
.card.error { border-top-color:var(--err); } .card.warning { border-top-color:var(--warn); }
.card.info { border-top-color:var(--info); }
details.card > summary { cursor:pointer; list-style:none; }
details.card > summary::-webkit-details-marker { display:none; }
details.card:not([open]) > summary .message { margin:0; }
details.card:not([open]) > summary::after { content:"show evidence, cost and fix"; color:var(--info);
  font-size:13px; }
.card h3 { margin:0; font-size:17px; display:flex; align-items:center; gap:10px; flex-wrap:wrap; }
.card .where { color:var(--muted); font-size:13px; margin:2px 0 10px; }
.card .message { margin:0 0 12px; font-size:15.5px; }
.pill { display:inline-block; font-size:11px; font-weight:650; text-transform:uppercase;
  letter-spacing:.06em; border-radius:999px; padding:2px 9px; }
.pill.error { background:var(--err-bg); color:var(--err); }
.pill.warning { background:var(--warn-bg); color:var(--warn); }
.pill.info { background:var(--info-bg); color:var(--info); }
.pill.style { background:#eef0f3; color:var(--muted); text-transform:none; letter-spacing:0; }
.cols { display:grid; grid-template-columns:1fr 1fr; gap:18px; }
@media (max-width:800px) { .cols { grid-template-columns:1fr; } }
.card h4 { font-size:12px; text-transform:uppercase; letter-spacing:.06em; color:var(--muted);
  margin:12px 0 6px; }
dl.kv { display:grid; grid-template-columns:max-content 1fr; gap:3px 14px; margin:0; font-size:14px; }
dl.kv dt { color:var(--muted); } dl.kv dd { margin:0; overflow-wrap:anywhere; font-variant-numeric:tabular-nums; }
ul.sources { margin:0; padding-left:18px; } ul.sources li { overflow-wrap:anywhere; }
.fix { margin-top:14px; border-top:1px dashed var(--line); padding-top:12px; }
.fix .summary { font-weight:600; margin:0 0 8px; }
.code { background:#f8f9fb; border:1px solid var(--line); border-radius:8px; padding:12px 14px;
  overflow-x:auto; margin:0; }
.code pre { margin:0; }
table.diff { border-collapse:collapse; width:100%; background:var(--card); border:1px solid var(--line);
  border-radius:10px; overflow:hidden; font-variant-numeric:tabular-nums; }
table.diff th, table.diff td { padding:9px 14px; text-align:right; border-bottom:1px solid var(--line); }
table.diff th:first-child, table.diff td:first-child { text-align:left; }
table.diff thead th { color:var(--muted); font-weight:600; font-size:12px; text-transform:uppercase; }
td.better { color:var(--ok); font-weight:600; } td.worse { color:var(--err); font-weight:600; }
ul.notes { color:var(--muted); } footer { color:var(--muted); font-size:12px; margin-top:36px; }
"""

BOOT = """
(function () {
  var nodes = document.querySelectorAll('script[type="application/json"][data-figure]');
  nodes.forEach(function (node) {
    var div = document.getElementById(node.getAttribute('data-figure'));
    function fail(e) { div.textContent = 'This chart failed to render: ' + e; console.error(e); }
    try {
      var fig = JSON.parse(node.textContent);
      Plotly.newPlot(div, fig.data, fig.layout,
        {displaylogo: false, responsive: true, modeBarButtonsToRemove: ['lasso2d', 'select2d']})
        .catch(fail);
    } catch (e) { fail(e); }
  });
})();
"""


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


def code_block(source: str) -> str:
    """Python source with syntax highlighting (pygments escapes the text)."""
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer

    return str(highlight(source, PythonLexer(), HtmlFormatter(cssclass="code", style="friendly")))


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
        f"<title>{esc(title)}</title>\n<style>{CSS}{code_css}</style>\n<script>"
    )
    tail = (
        f"</script>\n</head><body><main>\n{body}\n</main>\n"
        f"<script>{BOOT}</script>\n</body></html>\n"
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
