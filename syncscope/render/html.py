"""The HTML report: the problem in ten seconds (verdict, headline numbers, where the syncs
landed), the fix in a minute (finding cards with evidence, cost, source lines and snippet).

``render_html(run, findings) -> str`` returns one self-contained page; ``write_html`` writes
the same page to a file without holding it whole. Every string from a
run or a finding goes through ``esc`` (or pygments, which escapes); nothing here computes a
diagnosis, it only shows the model and the findings.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import IO

from syncscope._version import __version__
from syncscope.model import FAILED_KINDS, Finding, Run, compress_ranks, severity_rank
from syncscope.render import charts, timeline
from syncscope.render.page import code_block, esc, figure_block, page, section, write_page
from syncscope.render.summary import (
    Grid,
    Headline,
    frameworks_of,
    grid_of,
    headline,
    hta_lines,
    html_text,
    human_share,
    human_value,
    label_of,
    title_of,
    window_basis,
    window_time_text,
)
from syncscope.text import human_bytes, human_ns

VERDICT_TITLES = {
    "clean": "No gradient synchronization problems found",
    "warnings": "Training is correct, with warnings below",
    "incomplete": "Incomplete: part of the run could not be judged",
    "errors": "Gradient synchronization is broken: training results are affected",
    "failed": "The run failed: the script did not run to its end",
}
# what a finding at the verdict's severity says was found, in the headline's words
WASTES = {
    "redundant-sync": "communication",
    "fragmented-sync": "communication",
    "exposed-communication": "communication",
    "unsharded-grad-memory": "memory",
}
HAS = {
    "irregular-window": "windows of unequal length",
    "no-process-group": "ranks that never joined a process group",
}
BROKEN = {
    "missing-sync": "ranks diverge",
    "rank-divergence": "ranks diverge",
    "grad-reset-mid-window": "gradients are lost mid-window",
    "collective-mismatch": "ranks issue different collectives",
}
OPEN_CARDS = 3  # later findings start folded: a page with 40 findings stays readable
MAX_TEXT = 600


def render_html(run: Run, findings: Sequence[Finding]) -> str:
    return page(*_title_and_body(run, findings))


def write_html(run: Run, findings: Sequence[Finding], out: IO[bytes]) -> None:
    write_page(out, *_title_and_body(run, findings))


def _title_and_body(run: Run, findings: Sequence[Finding]) -> tuple[str, str]:
    grid = grid_of(run)
    head = headline(run, findings, grid)
    ordered = sorted(findings, key=lambda f: severity_rank(f.severity))
    parts = [
        _header(run, head),
        _verdict(head, ordered, len(grid.ranks)),
        _tiles(head),
        *_charts_top(grid, head),
        _findings(ordered),
        *_charts_detail(run, grid, ordered),
        _notes(run),
        f"<footer>syncscope {esc(__version__)} · every number here comes from the saved run; "
        "nothing on this page was fetched from the network.</footer>",
    ]
    return f"syncscope report: {title_of(run) or 'run'}", "\n".join(p for p in parts if p)


def _command(run: Run) -> str:
    return shlex.join(run.meta.command) if run.meta.command else ""


def _micro_batches(head: Headline) -> str:
    """``6``, or ``2-6`` when windows differ (never the common count alone)."""
    low, high = head.micro_batches_range
    return f"{low}-{high}" if low != high else f"{head.micro_batches_per_window}"


def _header(run: Run, head: Headline) -> str:
    m = run.meta
    facts = [
        f"{head.world_size:,} rank{'s' if head.world_size != 1 else ''}",
        f"{head.windows} windows x {_micro_batches(head)} micro-batches"
        if head.windows
        else "no complete window",
        "/".join(head.wrappers),
        f"{'live capture' if m.source == 'live' else 'from traces'}",
        f"torch {m.torch_version}" if m.torch_version else "",
        frameworks_of(run),
        m.created,
        f"{len(m.nodes)} nodes" if len(m.nodes) > 1 else "",
        "job hung" if m.hung else "",
    ]
    spans = "".join(f"<span>{esc(f)}</span>" for f in facts if f)
    return (
        '<header class="top"><span class="brand">syncscope</span>'
        f'<code class="cmd">{esc(title_of(run) or "(command not recorded)")}</code></header>'
        f'<p class="meta">{spans}</p>'
    )


def _failed_sub(head: Headline, findings: Sequence[Finding], ranks: int) -> str:
    """What failed, and what was still measured before it did."""
    failure = next(f for f in findings if f.kind in FAILED_KINDS)
    sub = (
        f"{failure.message}. Still measured: {head.windows} complete "
        f"window{'s' if head.windows != 1 else ''} on {ranks} rank{'s' if ranks != 1 else ''}"
    )
    rest = [f for f in findings if f.kind not in FAILED_KINDS]
    if rest:
        sub += (
            f"; {len(rest)} more finding{'s' if len(rest) != 1 else ''} from them below"
            if head.windows
            else f"; {len(rest)} more finding{'s' if len(rest) != 1 else ''} below"
        )
    return sub + "."


def _unique(items: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(items))


def verdict_title(verdict: str, findings: Sequence[Finding]) -> str:
    """The headline: the verdict, naming what was found (communication, memory, diverging
    ranks, ...), never a list of what might have been."""
    if verdict == "warnings":
        kinds = [f.kind for f in findings if f.severity == "warning"]
        wastes = _unique([WASTES[k] for k in kinds if k in WASTES])
        parts = [f"wastes {' and '.join(wastes)}"] if wastes else []
        parts += [f"has {HAS[k]}" for k in _unique(kinds) if k in HAS]
        if parts:
            return f"Training is correct, but {' and '.join(parts)}"
    if verdict == "errors":
        broken = _unique(
            [BROKEN[f.kind] for f in findings if f.severity == "error" and f.kind in BROKEN]
        )
        if broken:
            return f"Gradient synchronization is broken: {' and '.join(broken)}"
    return VERDICT_TITLES[verdict]


def _verdict(head: Headline, findings: Sequence[Finding], ranks: int) -> str:
    if head.verdict == "failed":
        sub = _failed_sub(head, findings, ranks)
    elif findings and head.verdict != "clean":
        sub = findings[0].message
        if len(findings) > 1:
            sub += (
                f" (and {len(findings) - 1} more finding{'s' if len(findings) > 2 else ''} below)"
            )
    elif not head.rank_windows:
        sub = "No optimizer step or backward pass was recorded: there was nothing to judge."
    elif not head.seen_syncs_max:
        sub = (
            "No gradient sync was recorded and none was expected: the script ran without a "
            "process group or a data-parallel wrapper."
        )
    else:
        sub = (
            f"{head.seen_syncs_per_window:.3g} gradient sync per window across "
            f"{head.world_size} ranks, after the last micro-batch, as it should be."
        )
    return (
        f'<div class="verdict {esc(head.verdict)}" id="verdict">'
        f"<h1>{esc(verdict_title(head.verdict, findings))}</h1><p>{esc(sub)}</p></div>"
    )


def _tile(label: str, value: str, sub: str = "", tone: str = "") -> str:
    return (
        f'<div class="tile {esc(tone)}"><div class="label">{esc(label)}</div>'
        f'<div class="value">{value}</div><div class="sub">{esc(sub)}</div></div>'
    )


def _sync_tile(head: Headline) -> str:
    seen, expected = head.seen_syncs_per_window, head.expected_syncs_per_window
    synced = f"{human_bytes(head.grad_sync_bytes_per_window)} synced per window"
    if head.seen_syncs_min == head.seen_syncs_max:
        value, spread = f"{head.seen_syncs_min}", f"on every rank and window; {synced}"
    else:
        value = f"{head.seen_syncs_min}-{head.seen_syncs_max}"
        spread = f"{head.rank_windows_off:,} of {head.rank_windows:,} rank-windows off; {synced}"
    tone = "good" if not head.rank_windows_off else ("bad" if seen < expected else "warn")
    if not head.rank_windows:  # nothing closed a window: nothing to count syncs against
        value, spread, tone = "-", "no window was closed by an optimizer step", "warn"
    shown = f"{value} <small>({expected:.3g} expected)</small>"
    return _tile("grad syncs per window", shown, spread, tone)


def _speedup_tile(head: Headline) -> str:
    """The projected gain in a few words; how it is taken is under the tiles (_basis)."""
    p = head.projection
    if p is None:
        return ""
    if not p.shown or p.speedup is None:
        return _tile("projected speed-up", "not projected", p.omitted)
    s = p.speedup
    spread = f"range {s.low:.2f}-{s.high:.2f}x; " if s.high - s.low >= 0.005 else ""
    if p.widened:
        spread = f"range {s.low:.2f}-{s.high:.2f}x (see below why); "
    return _tile(
        "projected speed-up",
        esc(f"{s.median:.2f}x"),
        f"{spread}window {human_ns(head.baseline_window_ns)} -> "
        f"{human_ns(head.projected_window_ns)} after the fix",
        "good",
    )


def _comm_tile(head: Headline) -> str:
    if head.comm_ns is None:
        return ""
    sub = "per window"
    if head.exposed_comm_share is not None:
        sub += f"; {human_share(head.exposed_comm_share)} of the window exposed"
    return _tile("communication time", esc(human_ns(head.comm_ns)), sub)


def _tiles(head: Headline) -> str:
    tiles = [_sync_tile(head)]
    if head.wasted_bytes_per_window is not None or head.wasted_ns_per_window is not None:
        share = f", {human_share(head.wasted_share)} of the window" if head.wasted_share else ""
        tiles.append(
            _tile(
                "wasted per window",
                esc(human_bytes(head.wasted_bytes_per_window)),
                f"{human_ns(head.wasted_ns_per_window)} of exposed sync time{share}",
                "warn",
            )
        )
    steady = f"median of {head.steady_windows} steady" if head.steady_windows else ""
    window_sub = steady + (" windows" if head.steady_windows != 1 else " window")
    if not head.windows or not head.steady_windows:
        window_sub = window_basis(head)
    tiles.append(_tile("window time", esc(window_time_text(head)), window_sub))
    tiles.append(_speedup_tile(head))
    tiles.append(_comm_tile(head))
    tiles.append(
        _tile("peak memory", esc(human_bytes(head.peak_memory_bytes)), "highest on any rank")
        if head.peak_memory_bytes is not None
        else _tile("peak memory", "not measured", "no memory data in this run")
    )
    shown = [t for t in tiles if t]
    # one row of up to 6 on a wide page; narrower, rows of 3 (or 2), never one tile alone
    return f'<div class="tiles n{len(shown)}" id="headline">{"".join(shown)}</div>' + _basis(head)


def _basis(head: Headline) -> str:
    """How the headline figures were taken, in full, under the tiles."""
    parts = [f"Window time: {window_basis(head)}."] if head.windows else []
    if head.comm_ns is not None:
        parts.append(
            "Communication time: union of the time with a collective in flight, median over "
            "ranks and steady windows."
        )
    if head.exposed_comm_share is not None:
        parts.append(
            "Of which exposed communication: the part not overlapped with compute, as a share "
            "of window time."
        )
    p = head.projection
    if p is not None and p.shown:
        parts.append(
            f"Projected speed-up: {p.text()}, from {p.steady_windows} steady windows; "
            f"basis: {p.basis}."
        )
    return f'<p class="basis">{esc(" ".join(parts))}</p>' if parts else ""


def _charts_top(grid: Grid, head: Headline) -> list[str]:
    if not grid.windows:
        return [
            section("Where the gradient syncs landed", "No windows were recorded in this run.", [])
        ]
    lead = (
        "One sync belongs after the last micro-batch of each window (green). "
        "Amber is an extra sync, a red ring a sync that never happened."
    )
    if grid.large:
        lead = (
            f"{len(grid.ranks):,} ranks, aggregated. The square marks where the one sync per "
            "window belongs; the heatmap below shows any rank that differs."
        )
    return [
        section(
            "Where the gradient syncs landed",
            lead,
            [
                figure_block(charts.placement_figure(grid), "fig-placement"),
                figure_block(
                    charts.syncs_per_window_figure(grid, head.expected_syncs_per_window),
                    "fig-syncs",
                ),
            ],
            section_id="placement",
        )
    ]


def _charts_detail(run: Run, grid: Grid, findings: Sequence[Finding]) -> list[str]:
    if not grid.windows:
        return []
    flagged = [r for f in findings if f.severity != "info" for r in f.ranks]
    # findings name windows by index; the timeline takes a column (grid.first_window: 0)
    windows = [
        w - grid.first_window
        for f in findings
        for w in f.windows
        if 0 <= w - grid.first_window < grid.windows
    ]
    first = max(0, min(min(windows, default=0), grid.windows - timeline.TIMELINE_WINDOWS))
    ranks = timeline.timeline_ranks(run, flagged)
    shown = (
        ""
        if len(ranks) == len(grid.ranks)
        else f" Showing {len(ranks)} of {len(grid.ranks):,} ranks."
    )
    out = [
        section(
            "Bytes, time and memory per window",
            "",
            [figure_block(charts.window_metrics_figure(grid), "fig-window-metrics")],
            section_id="per-window",
        ),
        section(
            "Timeline",
            "Micro-batches, optimizer steps and the collectives on them, per rank." + shown,
            [figure_block(timeline.timeline_figure(run, ranks, first), "fig-timeline")],
            section_id="timeline",
        ),
    ]
    if grid.has_overlap:
        out.append(
            section(
                "Communication overlap",
                "Measured from the trace: how much communication "
                "ran behind compute and how much the ranks waited for.",
                [figure_block(timeline.overlap_figure(grid), "fig-overlap")],
                section_id="overlap",
            )
        )
    return out


def _findings(findings: Sequence[Finding]) -> str:
    if not findings:
        return ""
    return section(
        f"Findings ({len(findings)})",
        "Most severe first. Each card says what was seen, "
        "what it costs, where in the code, and how to fix it.",
        [finding_card(f, str(i), folded=i >= OPEN_CARDS) for i, f in enumerate(findings)],
        section_id="findings",
    )


def finding_card(f: Finding, ident: str, *, folded: bool = False) -> str:
    """One finding: what was seen, what it costs, where in the code, and the fix."""
    where = f"ranks {compress_ranks(f.ranks)}" if f.ranks else ""
    if f.windows:
        where += f"{' · ' if where else ''}windows {compress_ranks(f.windows)}"
    title = f'<span class="pill {esc(f.severity)}">{esc(f.severity)}</span>{esc(f.kind)}'
    tag = "details" if folded else "div"
    body = [
        f'<{tag} class="card {esc(f.severity)}" id="finding-{esc(ident)}">',
        "<summary>" if folded else "",
        f"<h3>{title}</h3>",
        f'<div class="where">{esc(where)}{" · cause: " if f.cause else ""}'
        f"<code>{esc(f.cause)}</code></div>",
        f'<p class="message">{esc(f.message)}</p>',
        "</summary>" if folded else "",
        '<div class="cols">',
        f"<div><h4>Evidence</h4>{_mapping(f.evidence)}</div>",
        f"<div><h4>Cost</h4>{_mapping(f.cost)}</div>",
        "</div>",
    ]
    if f.sites:
        from syncscope.render.terminal import site_text  # the path as the terminal shows it

        items = "".join(
            f"<li>{esc(role)}: <code>{esc(site_text(loc))}</code>"
            f"{' in <code>' + esc(loc.function) + '</code>' if loc.function else ''}</li>"
            for role, loc in f.sites
        )
        body.append(f'<h4>Source</h4><ul class="sources">{items}</ul>')
    if f.fix is not None:
        body.append(
            f'<div class="fix"><h4>Fix <span class="pill style">{esc(f.fix.style)}</span></h4>'
            f'<p class="summary">{html_text(f.fix.summary)}</p>'
            f"{code_block(f.fix.snippet, diff=bool(f.fix.diff))}</div>"
        )
    body.append(f"</{tag}>")
    return "\n".join(body)


def _mapping(values: dict[str, object]) -> str:
    """Any evidence or cost dict, keys the renderer has never seen included."""
    if not values:
        return '<p class="where">none recorded</p>'
    rows = "".join(f"<dt>{esc(label_of(k))}</dt><dd>{_value(k, v)}</dd>" for k, v in values.items())
    return f'<dl class="kv">{rows}</dl>'


def _value(key: str, value: object) -> str:
    if key == "hta":
        return "<br>".join(esc(line) for line in hta_lines(value))
    if isinstance(value, dict):
        return _mapping({str(k): v for k, v in value.items()})
    text = human_value(key, value)
    return esc(text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + " …")


def _notes(run: Run) -> str:
    if not run.meta.notes:
        return ""
    items = "".join(f"<li>{esc(n)}</li>" for n in run.meta.notes)
    return section(
        "What this data cannot tell", "", [f'<ul class="notes">{items}</ul>'], section_id="notes"
    )
