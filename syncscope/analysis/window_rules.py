"""The per-window rules: each compares one window of one rank with the principle and
yields an ``Observation`` where it breaks it (``WINDOW_RULES``, run on complete windows),
plus ``irregular``, which compares a rank's windows with each other. ``diagnose`` groups the
observations into findings.

The principle: per window, gradients are reduced exactly once, after the last micro-batch's
backward and before the optimizer step, with every micro-batch's gradient still present.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from syncscope.analysis import deepspeed_zero, reductions
from syncscope.analysis.advice import fix_style, in_framework
from syncscope.analysis.sync_helpers import (
    HELPER_CAUSE,
    REPLACED_CAUSES,
    helper_no_op,
    helper_text,
)
from syncscope.model import (
    Collective,
    RankRun,
    Severity,
    SourceLocation,
    Window,
)
from syncscope.model.figures import (
    early_sync_ns,
    mean,
    median,
)

FRAGMENT_MAX_MEAN_BYTES = 256 * 1024  # smaller collectives cost mostly their latency
FRAGMENT_BUCKET_BYTES = 25 * 1024 * 1024  # DDP's default bucket: what one collective can carry
# the extra calls' estimated cost, as a share of the window: reported from 1%; a warning
# from 10%, the share at which exposed-communication warns (syncscope/analysis/exposed.py)
FRAGMENT_MIN_SHARE = 0.01
FRAGMENT_WARNING_SHARE = 0.10


@dataclass
class Observation:
    """One window of one rank that breaks the principle in one way."""

    kind: str
    severity: Severity
    cause: str
    rank: int
    window: int
    evidence: dict[str, object]
    cost: dict[str, float]
    sites: list[tuple[str, SourceLocation]] = field(default_factory=list)
    fix: str | None = None


def _sites(window: Window, micro_batch: int) -> list[tuple[str, SourceLocation]]:
    out: list[tuple[str, SourceLocation]] = []
    if 0 <= micro_batch < len(window.micro_batches):
        mb = window.micro_batches[micro_batch]
        if mb.forward_site:
            out.append(("forward", mb.forward_site))
        if mb.backward_site:
            out.append(("backward", mb.backward_site))
    for toggle in window.toggles:
        if toggle.site is not None and not toggle.value:
            out.append((toggle.how, toggle.site))
            break
    if window.step_site:
        out.append(("step", window.step_site))
    return out


def _against_the_principle(window: Window) -> dict[str, object]:
    """What the window did beside what the principle expects: one grad sync, on the last
    micro-batch (the evidence ``redundant-sync`` and ``missing-sync`` both open with)."""
    n = len(window.micro_batches)
    return {
        "micro_batches": n,
        "expected_grad_syncs": 1,
        "expected_micro_batches": [n - 1],
        "grad_syncs": window.grad_syncs,
        "grad_sync_micro_batches": window.grad_sync_micro_batches,
    }


def _redundant_cause(rank: RankRun, window: Window, position: int) -> tuple[str, Severity]:
    mb = window.micro_batches[position]
    if mb.sync_each_batch:
        return "sync-each-batch", "info"
    toggled = bool(window.toggles)
    if mb.wrapper == "deepspeed":
        return deepspeed_zero.redundant_cause(rank, window, position)
    if mb.wrapper == "fsdp":
        if mb.forward_sync is False and mb.backward_sync:
            return "no_sync-forward-only", "warning"
        early_ops = {c.op for c in window.grad_sync_collectives if c.micro_batch == position}
        if {"reduce_scatter", "all_reduce"} <= early_ops:
            # HSDP (2-D mesh): reduce-scatter in the shard group, then the cross-replica
            # all-reduce, on every micro-batch: only the all-reduce needs to wait for the last
            return "hsdp-all-reduce-every-micro-batch", "warning"
        if early_ops == {"reduce_scatter"}:
            # gradients reduce-scattered each micro-batch stay sharded: deliberate (HSDP
            # skipping only its cross-replica all-reduce lands here too)
            return "fsdp-sharded-accumulation", "info"
        # what was seen: FSDP all-reduced (FSDP1 NO_SHARD, HSDP without its reduce-scatter)
        # or reduced with its sync on, before the last micro-batch
        return ("fsdp-all-reduce-early" if "all_reduce" in early_ops else "fsdp-sync-on-early"), (
            "warning"
        )
    if mb.wrapper == "ddp":
        if mb.forward_sync and (mb.in_no_sync_at_backward or mb.backward_sync is False):
            return "no_sync-backward-only", "warning"
        if mb.forward_sync and not toggled:
            return "no-no_sync", "warning"
        if mb.forward_sync is False and sum(w.kind == "ddp" for w in rank.wrappers) > 1:
            return "inner-wrapper", "warning"
        if mb.forward_sync:  # the window toggled, but not around this micro-batch's forward
            return "toggle-missed-micro-batch", "warning"
        # DDP reduced with its reducer not armed at forward (a backward-time decision: the
        # compiled-autograd reducer), or with no forward of it seen (a compiled forward)
        return ("reduced-unarmed" if mb.forward_sync is False else "forward-not-seen"), "warning"
    return ("no-no_sync" if not toggled else "toggled-yet-reduced"), "warning"


def _redundant(rank: RankRun, window: Window) -> Iterator[Observation]:
    n = len(window.micro_batches)
    if n < 2:
        return
    early = [c for c in window.grad_sync_collectives if c.micro_batch < n - 1]
    if not early or window.grad_syncs < 2:
        return  # a single reduction in the wrong place is a missing sync, not a redundant one
    positions = sorted({c.micro_batch for c in early})
    named = reductions.redundant_cause(rank, window, early)
    if named == reductions.STATIC_FIRST_CAUSE and reductions.first_window(rank, window):
        return  # static_graph=True: the first backward of training must sync
    severity: Severity
    cause, severity = (named, "warning") if named else _redundant_cause(rank, window, positions[0])
    helper = helper_no_op(window, positions[0]) if cause in REPLACED_CAUSES else None
    if helper is not None:  # the user's own helper was meant to skip these syncs
        cause, severity = HELPER_CAUSE, "warning"
    # exposed sync time (syncscope.model.figures), not a sum of overlapping collective durations
    wasted_ns = early_sync_ns(window)
    duration = max(window.duration_ns, 1)
    cost: dict[str, float] = {
        "wasted_bytes_per_window": sum(c.bytes for c in early),
        "redundant_collectives_per_window": len(early),
        "redundant_time_ns_per_window": wasted_ns,
        "share_of_window_time": min(1.0, wasted_ns / duration),
        "window_ns": window.duration_ns,
        "projected_window_ns": max(0, window.duration_ns - wasted_ns),
    }
    fix = fix_style(rank, window)
    evidence = reductions.cause_evidence(cause, window, early)
    sites = _sites(window, positions[0]) + ([("sync_helper", helper)] if helper else [])
    if helper is not None or cause == reductions.NOT_FSDP_CAUSE:
        evidence.update(_helper_targets(rank))
    missed = reductions.setter_missed(rank, window) if named == reductions.NOT_FSDP_CAUSE else None
    if missed is not None:
        sites = [("sync_toggle", missed.setter_sites[0]), *sites]
    if named:
        fix = reductions.fix_for(named) or fix
    elif reductions.static_graph_ddp(rank) is not None and fix.startswith("ddp-"):
        fix = "static-graph"  # never no_sync on the first backward of a static-graph DDP
    elif cause in ("hsdp-all-reduce-every-micro-batch", "fsdp-sharded-accumulation"):
        fix = _sharded_cost(rank, cause, early, cost)
    elif cause == "sync-each-batch":
        fix = "sync-each-batch"
    elif cause == HELPER_CAUSE and {"reduce_scatter", "all_reduce"} <= {c.op for c in early}:
        fix = "hsdp"
    elif window.micro_batches[positions[0]].wrapper == "deepspeed":
        cost.update(deepspeed_zero.redundant_cost(rank, window, cause))
        fix = deepspeed_zero.fix_for(cause)
    fix = in_framework(rank, fix)
    yield Observation(
        "redundant-sync",
        severity,
        cause,
        rank.rank,
        window.index,
        {
            **_against_the_principle(window),
            "grad_sync_collectives": len(window.grad_sync_collectives),
            **({"sync_helper": helper_text(helper)} if helper else {}),
            **evidence,
        },
        cost,
        sites,
        fix,
    )


def _sharded_cost(
    rank: RankRun, cause: str, early: list[Collective], cost: dict[str, float]
) -> str:
    """FSDP's trade-off figures, added to ``cost``; returns the fix style."""
    fsdp = [w for w in rank.wrappers if w.kind == "fsdp"]
    unsharded = sum(w.param_bytes for w in fsdp)
    shard = max((w.shard_world for w in fsdp), default=1)
    extra = int(unsharded * (1 - 1 / max(shard, 1)))
    if cause == "hsdp-all-reduce-every-micro-batch":
        # keep the reduce-scatter (sharded gradients), skip only the cross-replica all-reduce;
        # the alternative, set_requires_gradient_sync, also skips the reduce-scatter and holds
        # unsharded gradients between micro-batches: its memory cost, per rank
        cost["all_reduce_bytes_skipped_per_window"] = sum(
            c.bytes for c in early if c.op == "all_reduce"
        )
        if unsharded:  # unknown (traces record no wrapper): said so after grouping, never 0
            cost["extra_memory_bytes_if_gradient_sync_skipped"] = extra
        return "hsdp"
    if unsharded:  # unknown (traces record no wrapper): said so after grouping, never 0
        cost["extra_memory_bytes_if_skipped"] = extra
    # HSDP: the cross-replica all-reduce can be skipped while keeping shards reduced
    return "hsdp" if any(c.op == "all_reduce" for c in early) else "fsdp-sharded"


def _helper_targets(rank: RankRun) -> dict[str, object]:
    """What a no-op sync helper was given, as the run saw the FSDP roots: the user's module
    around them when it is not an FSDPModule, and the FSDP modules inside."""
    fsdp = [w for w in rank.wrappers if w.kind == "fsdp"]
    outer = next((w.outer for w in fsdp if w.outer), "")
    modules = [m or "(root)" for w in fsdp for m in w.fsdp_modules]
    out: dict[str, object] = {}
    if outer:
        out["helper_target"] = outer
    if modules:
        out["fsdp_modules"] = modules[:16]
    return out


def _reduced_twice(rank: RankRun, window: Window) -> Iterator[Observation]:
    """The same gradients reduced by a wrapper and by hand on one micro-batch."""
    hand = reductions.reduced_twice(window)
    if hand:
        position = hand[0].micro_batch
        wasted_ns = sum(c.duration_ns for c in hand)
        yield Observation(
            "redundant-sync",
            "warning",
            reductions.TWICE_CAUSE,
            rank.rank,
            window.index,
            reductions.twice_evidence(window, position, hand),
            {
                "wasted_bytes_per_window": sum(c.bytes for c in hand),
                "redundant_collectives_per_window": len(hand),
                "reduced_twice_time_ns_per_window": wasted_ns,
                "share_of_window_time": min(1.0, wasted_ns / max(window.duration_ns, 1)),
                "window_ns": window.duration_ns,
            },
            [("all_reduce", c.site) for c in hand[:1] if c.site] + _sites(window, position),
            "reduced-twice",
        )


def _missing_cause(rank: RankRun, window: Window) -> str:
    last = window.micro_batches[-1]
    hows = {t.how for t in window.toggles}
    if (
        not window.grad_sync_collectives
        and last.wrapper == "ddp"
        and last.forward_sync
        and not last.in_no_sync_at_backward
        and last.backward_sync is not False
    ):
        # DDP armed its reducer at the last forward and the backward ran outside no_sync,
        # yet the window reduced nothing: the reducer waited for gradients some parameters
        # never got (a branch that micro-batch did not use, find_unused_parameters=False);
        # the loop's sync gate is right
        return reductions.UNUSED_CAUSE
    if not window.grad_sync_collectives:
        if last.wrapper == "fsdp" or "set_requires_gradient_sync" in hows:
            return "fsdp-sync-never-re-enabled"
        if last.wrapper == "none" and rank.wrappers:
            return "wrapper-bypassed"
        if last.wrapper == "ddp" and last.in_no_sync_at_forward and last.in_no_sync_at_backward:
            return "step-inside-no_sync"
        if not rank.wrappers:
            return "no-sync"
    if "require_backward_grad_sync" in hows and any(
        not t.before_forward for t in window.toggles if t.how == "require_backward_grad_sync"
    ):
        return "flag-after-forward"
    return "misplaced-sync"


def _alone_in_shard_group(rank: RankRun, window: Window) -> bool:
    """FSDP2 with a shard group of one and no reduction at all: with nobody to reduce with,
    FSDP issues none (measured on CUDA and CPU); that is not a missing sync."""
    fsdp = [w for w in rank.wrappers if w.kind == "fsdp"]
    return (
        bool(fsdp)
        and all(w.shard_world <= 1 for w in fsdp)
        and window.micro_batches[-1].wrapper == "fsdp"
        and not window.grad_sync_collectives
    )


def _missing(rank: RankRun, window: Window) -> Iterator[Observation]:
    n = len(window.micro_batches)
    if n == 0 or any(c.micro_batch == n - 1 for c in window.grad_sync_collectives):
        return
    if _alone_in_shard_group(rank, window):
        return
    cause = _missing_cause(rank, window)
    fix = reductions.fix_for(cause) or in_framework(rank, fix_style(rank, window))
    yield Observation(
        "missing-sync",
        "error",
        cause,
        rank.rank,
        window.index,
        {
            **_against_the_principle(window),
            "unsynced_micro_batches": [
                i for i in range(n) if i > max(window.grad_sync_micro_batches, default=-1)
            ],
            **_bypass_evidence(rank, cause),
        },
        {"window_ns": window.duration_ns},
        _sites(window, n - 1),
        fix,
    )


def _bypass_evidence(rank: RankRun, cause: str) -> dict[str, object]:
    if cause != "wrapper-bypassed":
        return {}
    wrapper = rank.wrappers[0]
    return {
        "bypassed_wrapper": wrapper.label,
        "reductions_lost": "every gradient reduction of the window: the wrapper's forward "
        "never ran, so nothing armed its reduction",
    }


def _grad_reset(rank: RankRun, window: Window) -> Iterator[Observation]:
    n = len(window.micro_batches)
    wiped = [r for r in window.grad_resets if r.after_micro_batches > 0]
    if not wiped:
        return
    lost = max(r.after_micro_batches for r in wiped)
    sites = [(r.how, r.site) for r in wiped if r.site is not None][:1]
    yield Observation(
        "grad-reset-mid-window",
        "error",
        wiped[0].how,
        rank.rank,
        window.index,
        {
            "micro_batches": n,
            "reset_after_micro_batches": sorted({r.after_micro_batches for r in wiped}),
            "micro_batches_lost": lost,
        },
        {"lost_share_of_gradient": lost / n if n else 1.0},
        sites + _sites(window, n - 1)[-1:],
        in_framework(rank, "zero-grad"),
    )


def _fragmented(rank: RankRun, window: Window) -> Iterator[Observation]:
    """Rounds of many small collectives, reported when their measured extra calls cost a
    material share of the window (docs/findings/fragmented-sync.md)."""
    # a wrapper's own reductions: FSDP's per fully_shard group (the wrapping decides),
    # DeepSpeed's (its reduce_bucket_size decides), DDP's buckets unless the script made them
    # smaller than the default (bucket_cap_mb)
    small_buckets = any(
        w.kind == "ddp"
        and w.bucket_cap_bytes is not None
        and w.bucket_cap_bytes < FRAGMENT_BUCKET_BYTES
        for w in rank.wrappers
    )
    own = {"fsdp", "deepspeed"} if small_buckets else {"fsdp", "deepspeed", "ddp", "autograd"}
    rounds: dict[tuple[int, str, str], list[Collective]] = {}
    for c in window.grad_sync_collectives:
        # a reduction DDP makes too is reduced twice (reduced-twice): removed, not bucketed
        if c.issuer not in own and not c.also_reduced_by:
            rounds.setdefault((c.micro_batch, c.phase, c.issuer), []).append(c)
    ideal = {k: -(-sum(c.bytes for c in r) // FRAGMENT_BUCKET_BYTES) for k, r in rounds.items()}
    small = {
        k: r
        for k, r in rounds.items()
        if len(r) > max(1, ideal[k]) and mean([c.bytes for c in r]) <= FRAGMENT_MAX_MEAN_BYTES
    }
    if not small:
        return
    extra = sum(len(r) - max(1, ideal[k]) for k, r in small.items())
    # each call's host-side time, issue to return: a blocking call's whole latency, an
    # asynchronous one's issue cost (the least it adds); the median leaves out the call that
    # absorbs the ranks' skew
    call_ns = median([float(c.end_ns - c.start_ns) for r in small.values() for c in r])
    overhead = call_ns * extra
    share = overhead / max(window.duration_ns, 1)
    if share < FRAGMENT_MIN_SHARE:
        return
    largest = max(small, key=lambda k: len(small[k]))
    yield Observation(
        "fragmented-sync",
        "warning" if share >= FRAGMENT_WARNING_SHARE else "info",
        "unbucketed",
        rank.rank,
        window.index,
        {
            "collectives_per_round": len(small[largest]),
            "ideal_collectives_per_round": max(1, ideal[largest]),
            "mean_bytes": int(mean([c.bytes for c in small[largest]])),
            "rounds": len(small),
        },
        {
            "collective_call_ns": call_ns,
            "extra_collectives_per_window": extra,
            "estimated_latency_overhead_ns_per_window": overhead,
            "window_ns": window.duration_ns,
            "share_of_window_time": min(1.0, share),
        },
        [("collective", c.site) for c in small[largest] if c.site][:1],
        "bucket",
    )


def _unsharded_memory(rank: RankRun, window: Window) -> Iterator[Observation]:
    mbs = window.micro_batches
    if len(mbs) < 2 or mbs[-1].wrapper != "fsdp":
        return
    skipped = [mb for mb in mbs[:-1] if mb.backward_sync is False]
    positions = {c.micro_batch for c in window.grad_sync_collectives}
    if not skipped or positions != {len(mbs) - 1}:
        return  # only a correct skip-then-sync window holds unsharded gradients on purpose
    fsdp = [w for w in rank.wrappers if w.kind == "fsdp"]
    unsharded = sum(w.param_bytes for w in fsdp)
    shard = max((w.shard_world for w in fsdp), default=1)
    yield Observation(
        "unsharded-grad-memory",
        "info",
        "sync-skipped",
        rank.rank,
        window.index,
        {"micro_batches_holding_unsharded_grads": len(skipped)},
        {
            "estimated_extra_memory_bytes": int(unsharded * (1 - 1 / max(shard, 1))),
            "peak_memory_bytes": window.peak_memory_bytes,
        },
        _sites(window, 0),
        "fsdp-sharded",
    )


def _deepspeed(rank: RankRun, window: Window) -> Iterator[Observation]:
    """DeepSpeed's own misuses (``syncscope.analysis.deepspeed_zero``), as observations."""
    for m in deepspeed_zero.observations(rank, window):
        sites = [*m.sites, *_sites(window, m.position)]
        yield Observation(
            m.kind, m.severity, m.cause, rank.rank, window.index, m.evidence, m.cost, sites, m.fix
        )


WINDOW_RULES: tuple[Callable[[RankRun, Window], Iterator[Observation]], ...] = (
    _redundant,
    _reduced_twice,
    _missing,
    _grad_reset,
    _fragmented,
    _unsharded_memory,
    _deepspeed,
)


def irregular(rank: RankRun) -> Iterator[Observation]:
    complete = [w for w in rank.windows if w.complete and w.micro_batches and not w.records_dropped]
    if len(complete) < 2:
        return
    sizes = Counter(len(w.micro_batches) for w in complete)
    usual, _ = sizes.most_common(1)[0]
    for w in complete:
        n = len(w.micro_batches)
        if n != usual:
            cause = "first-window" if w.index == 0 else "uneven-window"
            yield Observation(
                "irregular-window",
                "warning",
                cause,
                rank.rank,
                w.index,
                {"micro_batches": n, "usual_micro_batches": usual},
                {"effective_batch_share": n / usual},
                [("step", w.step_site)] if w.step_site else [],
                in_framework(rank, "step-gate"),
            )
