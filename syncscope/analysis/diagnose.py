"""Diagnoses: pure functions from a Run to Findings.

All rules follow one principle: per window, gradients are reduced exactly once, after the
last micro-batch's backward and before the optimizer step, with every micro-batch's gradient
still present, identical across ranks. Each rule compares what a rank was *measured* doing
with that principle; the wrapper's sync intent (DDP decides at forward, FSDP at backward)
is used only to name the cause and pick the fix.

Per-window observations are grouped into one Finding per (kind, cause) with the ranks and
windows affected, so a 1,024-rank job yields a handful of findings, not a million.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace

from syncscope.analysis import coverage, recipes, reductions
from syncscope.analysis.advice import SNIPPETS
from syncscope.analysis.crossrank import rank_divergence, run_failed
from syncscope.analysis.hangs import hang_and_mismatch, waited_for_rank
from syncscope.analysis.sync_helpers import (
    name_helper,
)
from syncscope.analysis.window_rules import (
    FRAGMENT_WARNING_SHARE,
    WINDOW_RULES,
    Observation,
    irregular,
)
from syncscope.model import (
    FAILED_KINDS,
    INCOMPLETE_KINDS,
    Finding,
    RankRun,
    Run,
    Severity,
    severity_rank,
)
from syncscope.model.figures import (
    Steady,
    median,
    projection,
    saved_ns,
    steady_windows,
)
from syncscope.model.per_model import model_views


def _fragmented_figures(findings: list[Finding]) -> list[Finding]:
    """The grouped card's derived figures, and its severity, from the medians shown beside
    them (a median of products is not the product of the medians)."""
    out = []
    for f in findings:
        if f.kind == "fragmented-sync":
            cost = dict(f.cost)
            call, extra, window = (
                float(v) if isinstance(v, (int, float)) else 0.0
                for v in (
                    cost["collective_call_ns"],
                    cost["extra_collectives_per_window"],
                    cost["window_ns"],
                )
            )
            cost["estimated_latency_overhead_ns_per_window"] = call * extra
            share = min(1.0, call * extra / max(window, 1.0))
            cost["share_of_window_time"] = share
            # the card's severity follows the share it shows, not its worst window's
            severity: Severity = "warning" if share >= FRAGMENT_WARNING_SHARE else "info"
            f = replace(f, cost=cost, severity=severity)
        out.append(f)
    return out


def _redundant_figures(run: Run, findings: list[Finding], steady: Steady) -> list[Finding]:
    """A redundant-sync card's time figures from one source, the projection
    (syncscope.model.figures.projection over the card's ranks): the window and projected window
    times are its medians, the exposed sync time their difference, the share that over the
    window. When the projection is omitted, the card says so with the same reason as the
    summary (``projection_omitted``) and projects no window time."""
    out = []
    for f in findings:
        if f.kind == "redundant-sync" and "redundant_time_ns_per_window" in f.cost:
            cost = dict(f.cost)
            p = projection(run, f.ranks, steady)
            if p.window is not None and p.projected is not None:
                window, projected = p.window.median, p.projected.median
                cost["window_ns"] = window
                cost["redundant_time_ns_per_window"] = max(0.0, window - projected)
                cost["share_of_window_time"] = min(1.0, (window - projected) / max(window, 1.0))
                cost["projected_window_ns"] = projected
            if not p.shown:
                cost.pop("projected_window_ns", None)
                cost["projection_omitted"] = p.omitted or "no steady window"
            f = replace(f, cost=cost)
        out.append(f)
    return out


MESSAGES = {
    "redundant-sync": "gradients reduced on micro-batches other than the window's last",
    "missing-sync": "the last micro-batch's gradients were not reduced before optimizer.step()",
    "grad-reset-mid-window": "gradients wiped between micro-batches of a window",
    "fragmented-sync": "many small gradient collectives where one bucketed collective would do",
    "unsharded-grad-memory": "FSDP holds unsharded gradients between micro-batches",
    "irregular-window": "windows of unequal size",
}


# where a cause says more than its kind's message
CAUSE_MESSAGES = {
    reductions.TWICE_CAUSE: "the same gradients reduced twice in one window, by DDP and by hand",
    reductions.PIPELINE_CAUSE: (
        "gradients reduced at the end of every pipeline schedule step(), several per window"
    ),
}


def _saved_across_ranks(observations: list[Observation], saved: dict[int, int]) -> None:
    """Redundant time as the projection counts it (syncscope.model.figures.saved_ns): per early
    micro-batch the least any rank waited, so skew between ranks is not priced as waste."""
    for o in observations:
        if o.kind != "redundant-sync" or o.window not in saved:
            continue
        window_ns = float(o.cost["window_ns"])
        wasted = float(saved[o.window])
        o.cost["redundant_time_ns_per_window"] = wasted
        o.cost["share_of_window_time"] = min(1.0, wasted / max(window_ns, 1.0))
        o.cost["projected_window_ns"] = max(0.0, window_ns - wasted)


def _of_model(
    rank: RankRun, model: str, observations: Iterable[Observation]
) -> Iterator[Observation]:
    """A several-model rank's observations name the model they are about, and where the
    script wrapped it."""
    site = next((w.site for w in rank.wrappers if w.label == model), None)
    for o in observations:
        if model:
            named: dict[str, object] = {"model": model}
            if site is not None:
                named["model_wrapped_at"] = str(site)
            o.evidence = {**named, **o.evidence}
        yield o


def _group(observations: list[Observation], steady: Steady | None = None) -> list[Finding]:
    groups: dict[tuple[str, str, object], list[Observation]] = {}
    for o in observations:  # one finding per model where a rank steps several
        groups.setdefault((o.kind, o.cause, o.evidence.get("model")), []).append(o)
    findings: list[Finding] = []
    for (kind, cause, _), items in groups.items():
        first = items[0]
        # costs: the median over the steady windows (syncscope.model.figures), as the headline's
        # window time is; the warm-up windows only when no steady window is affected
        basis = [o for o in items if steady is not None and o.window in steady] or items
        numeric = {
            k: median([float(o.cost[k]) for o in basis if k in o.cost])
            for k in first.cost
            if any(k in o.cost for o in basis)
        }
        windows = sorted({o.window for o in items})
        ranks = sorted({o.rank for o in items})
        findings.append(
            Finding(
                kind=kind,
                severity=min((o.severity for o in items), key=severity_rank),
                cause=cause,
                message=f"{CAUSE_MESSAGES.get(cause) or MESSAGES.get(kind, kind)} ({cause})",
                ranks=tuple(ranks),
                windows=tuple(windows),
                evidence={
                    **first.evidence,
                    "example_rank": first.rank,
                    "example_window": first.window,
                },
                cost={**numeric, "windows_affected": len(windows)},
                sites=tuple(first.sites),
                fix=SNIPPETS.get(first.fix) if first.fix else None,
            )
        )
    return findings


def sync_applies(run: Run) -> bool:
    """Gradient-sync rules apply to distributed jobs, and to any job that wraps its model
    for data parallelism or reduces gradients itself (DDP at world size 1 still syncs)."""
    if not any(r.dist_initialized for r in run.ranks):
        return False
    return run.world_size > 1 or any(
        r.wrappers or any(w.grad_sync_collectives for w in r.windows) for r in run.ranks
    )


def diagnose(run: Run) -> list[Finding]:
    observations: list[Observation] = []
    if sync_applies(run):
        for rank in run.ranks:
            for window in rank.windows:
                if not window.complete or window.records_dropped:
                    continue  # an incomplete record draws no finding (a note says why)
                for model, view in model_views(rank, window):  # per DDP model, if several
                    for rule in WINDOW_RULES:
                        observations.extend(_of_model(rank, model, rule(rank, view)))
        if any(o.kind == "redundant-sync" for o in observations):
            _saved_across_ranks(observations, saved_ns(run))
    for rank in run.ranks:
        observations.extend(irregular(rank))
    steady = steady_windows(run)
    grouped = _redundant_figures(run, _fragmented_figures(_group(observations, steady)), steady)
    findings = [unknown_memory(name_helper(f)) for f in grouped]
    findings.extend(coverage_findings(run))
    findings.extend(recipes.skipped_steps(run))
    findings.extend(recipes.local_sgd_finding(run))
    if not coverage.independent_copies(run):  # their gradients differ by design
        findings.extend(rank_divergence(run, findings))
    findings.extend(hang_and_mismatch(run))  # a hang's mismatch is its cause: one card
    findings.extend(run_failed(run))
    findings.extend(waited_for_rank(run))
    # a run that did not finish says so first; what its complete windows show follows, and
    # what could not be judged comes first among the warnings
    findings.sort(
        key=lambda f: (
            f.kind not in FAILED_KINDS,
            severity_rank(f.severity),
            f.kind not in INCOMPLETE_KINDS,
            f.kind,
            f.cause,
        )
    )
    return findings


# memory costs of keeping FSDP gradients unsharded, by cause: null (unknown) where the run
# recorded no parameter sizes (traces), rather than a 0 that reads as "no cost"
UNSHARDED_MEMORY_COSTS = {
    "fsdp-sharded-accumulation": "extra_memory_bytes_if_skipped",
    "hsdp-all-reduce-every-micro-batch": "extra_memory_bytes_if_gradient_sync_skipped",
}


def unknown_memory(finding: Finding) -> Finding:
    key = UNSHARDED_MEMORY_COSTS.get(finding.cause)
    if finding.kind != "redundant-sync" or key is None or key in finding.cost:
        return finding
    return replace(finding, cost={**finding.cost, key: None})


def coverage_findings(run: Run) -> list[Finding]:
    """What the run lets syncscope judge (syncscope.analysis.coverage): no optimizer step,
    ranks without data, ranks that never joined a process group."""
    return [
        *coverage.no_optimizer_step(run),
        *coverage.ranks_missing(run),
        *coverage.no_process_group(run),
    ]
