"""Diagnoses of a stopped or waiting job: ``hang`` (syncscope profile stopped it) with the
collective mismatch behind it on the same card, and ``waited-for-rank``.

Pure functions of the ``Run``: what each rank's events and the monitor's view of its main
thread (``meta.json``'s ``hang`` and ``waits``) say."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from syncscope.analysis.advice import SNIPPETS
from syncscope.analysis.crossrank import collective_mismatch
from syncscope.model import Finding, PendingCollective, RankRun, Run, compress_ranks


def _pending_text(p: PendingCollective | None) -> str:
    if p is None:
        return "none"
    return (
        f"{p.op} #{p.seq + 1} ({p.bytes} bytes) in window {p.window}, "
        f"micro-batch {p.micro_batch}, {p.phase}"
    )


RELEASED_BY_STOP_NS = 1_000_000_000  # done this close to the exit record of a hung job


def _released_by_stop(
    r: RankRun, waiting: bool = True
) -> tuple[PendingCollective | None, PendingCollective | None]:
    """(blocked, last completed) of a rank stopped in a hang.

    Stopping a hung job ends its collectives with an error, which capture then sees as
    completed just before the exit record: such a collective is what the rank was blocked
    in, and the last completed one is the one before it. Not for a rank whose main thread
    was not ``waiting`` in torch.distributed (asleep elsewhere: its last collective's
    completion was merely noticed at its exit record).
    """
    blocked = r.pending[-1] if r.pending else None
    last = r.last_completed
    if blocked is not None or last is None or not r.finished or not waiting:
        return blocked, last
    done: dict[int, tuple[int, PendingCollective]] = {}
    for w in r.windows:
        for c in w.collectives:
            if c.done_ns is not None:
                done[c.seq] = (
                    c.done_ns,
                    PendingCollective(
                        c.seq, c.op, c.bytes, c.group_ranks, c.start_ns, w.index,
                        c.micro_batch, c.phase,
                    ),
                )  # fmt: skip
    entry = done.get(last.seq)
    if entry is None or r.last_event_ns - entry[0] > RELEASED_BY_STOP_NS:
        return blocked, last
    earlier = [
        v for k, v in done.items() if k != last.seq and v[0] < entry[0] - RELEASED_BY_STOP_NS
    ]
    previous = max(earlier, key=lambda v: v[0])[1] if earlier else None
    return last, previous


def hang(run: Run) -> list[Finding]:
    if not run.meta.hung:
        return []
    timeout = run.meta.hang_timeout_s
    if run.meta.hang_start_up:
        return [_start_up_hang(run)]
    threads = run.meta.main_threads  # the ranks still running when it was stopped
    per_rank = {}
    stories: dict[int, str] = {}
    for r in run.ranks:
        stories[r.rank] = threads.get(str(r.rank)) or _ended(r)
        per_rank[str(r.rank)] = _collectives_of(r, threads.get(str(r.rank)))
    evidence: dict[str, object] = {"per_rank": per_rank}
    if threads:  # what each rank's main thread did when it was stopped
        evidence["main_threads"] = dict(threads)
    waiters = {r for r, text in stories.items() if text.startswith("waiting in ")}
    culprits = sorted(set(stories) - waiters) if waiters else []
    stuck = [r for r in culprits if str(r) in threads]  # alive, not in communication
    told = [*culprits, *sorted(waiters)][:4]
    said = "; ".join(f"rank {r} {stories[r]}" for r in told)
    more = f"; and {len(stories) - len(told)} more" if len(stories) > len(told) else ""
    return [
        Finding(
            kind="hang",
            severity="error",
            cause="no-progress",
            message=f"no progress for {timeout:g} s: syncscope stopped the job: {said}{more}",
            ranks=tuple(culprits) or tuple(r.rank for r in run.ranks),
            windows=(),
            evidence=evidence,
            cost={"hang_timeout_s": timeout or 0},
            fix=SNIPPETS["stuck-rank" if stuck else "same-sequence"],
        )
    ]


def _collectives_of(r: RankRun, thread: str | None) -> dict[str, str]:
    """A stopped rank's last completed collective and the one it was blocked in, as its
    records say; where lines of its file could not be read (dropped), what they hid is said
    so, and the collective its main thread waited in is the one it was blocked in."""
    waiting = (thread or "waiting in").startswith("waiting in")
    blocked, last_completed = _released_by_stop(r, waiting)
    dropped = sum(w.records_dropped for w in r.windows)
    unread = f"{dropped} line(s) of its file could not be read"  # noted with the lines
    last = _pending_text(last_completed)
    if blocked:
        return {"last_completed": last, "blocked_in": _pending_text(blocked)}
    if thread and thread.startswith("waiting in ") and dropped:
        blocked_in = f"{thread.removeprefix('waiting in ')} (its main thread; {unread})"
    elif thread is not None or not r.finished:
        blocked_in = "no collective in flight"
    else:
        blocked_in = _ended(r)
    if last_completed is None and dropped:
        last = f"not known: {unread}"
    return {"last_completed": last, "blocked_in": blocked_in}


def _ended(r: RankRun) -> str:
    """What a rank that ended before the job was stopped did, in words."""
    if not r.finished:
        return "stopped without an exit record"
    status = "" if r.exit_status is None else f" (exit status {r.exit_status})"
    if r.exit_status == 0:
        return f"had ended its script{status}"
    return f"had failed{status}: {r.exit_reason}" if r.exit_reason else f"had failed{status}"


def hang_and_mismatch(run: Run) -> list[Finding]:
    """The hang of a stopped job, and the collective mismatch behind it as one card: the
    mismatch goes into the hang's evidence (``collective_mismatch``) with its lines, or is
    dropped where the rank whose sequence ended is the one the hang names (it never came)."""
    mismatches = collective_mismatch(run)
    hangs = hang(run)
    if not hangs or hangs[0].cause != "no-progress" or not mismatches:
        return mismatches + hangs
    found, mismatch = hangs[0], mismatches[0]
    told: Any = mismatch.evidence.get("per_rank", {})
    short = {int(r) for r, text in told.items() if str(text).startswith("nothing")}
    evidence = dict(found.evidence)
    sites = found.sites
    if mismatch.cause != "count" or not short <= set(found.ranks):
        evidence["collective_mismatch"] = mismatch.message
        sites = mismatch.sites or sites
    return [dataclasses.replace(found, evidence=evidence, sites=sites), *mismatches[1:]]


def _start_up_hang(run: Run) -> Finding:
    """No rank had its process group when the job was stopped: it never started."""
    threads = run.meta.main_threads
    timeout = run.meta.hang_timeout_s or 0
    shown = sorted(threads.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0)
    said = "; ".join(f"rank {rank} {text}" for rank, text in shown[:4])
    more = f"; and {len(shown) - 4} more" if len(shown) > 4 else ""
    return Finding(
        kind="hang",
        severity="error",
        cause="start-up",
        message=f"the job never reached its process group: no progress for {timeout:g} s "
        f"before any rank had one, and syncscope stopped the job: {said}{more}",
        ranks=tuple(r.rank for r in run.ranks) or tuple(int(k) for k, _ in shown if k.isdigit()),
        windows=(),
        evidence={"per_rank": dict(shown)},
        cost={"hang_timeout_s": timeout},
        fix=SNIPPETS["start-up"],
    )


WAIT_EPISODES_SHOWN = 16


def _wait_evidence(waiting: list[int], waits: list[dict[str, Any]]) -> dict[str, object]:
    evidence: dict[str, object] = {"waiting_ranks": waiting, "waits": waits[:WAIT_EPISODES_SHOWN]}
    if len(waits) > WAIT_EPISODES_SHOWN:
        evidence["waits_not_shown"] = len(waits) - WAIT_EPISODES_SHOWN
    return evidence


def waited_for_rank(run: Run) -> list[Finding]:
    """Ranks that waited in torch.distributed while another rank computed, as
    ``syncscope profile``'s monitor saw them (meta.json ``waits``): not a hang, a cost."""
    by_culprit: dict[tuple[int, ...], list[dict[str, Any]]] = defaultdict(list)
    for wait in run.meta.waits:
        entry: dict[str, Any] = dict(wait)
        by_culprit[tuple(sorted(set(entry["for"])))].append(entry)  # each rank once
    findings = []
    for culprits, waits in sorted(by_culprit.items()):
        longest = max(waits, key=lambda w: float(w["seconds"]))
        waiting = sorted({int(w["rank"]) for w in waits})
        total = round(sum(float(w["seconds"]) for w in waits), 1)
        running = longest.get("running", {})
        doing = "; ".join(f"rank {r} running at {at}" for r, at in list(running.items())[:4])
        message = (
            f"rank(s) {compress_ranks(waiting)} waited up to {float(longest['seconds']):g} s "
            f"for rank(s) {compress_ranks(culprits)} ({doing}); rank {longest['rank']} "
            f"{longest.get('waiting', '')}"
        )
        if len(waits) > 1:
            message += f"; {len(waits)} waits, {total:g} s in all"
        findings.append(
            Finding(
                kind="waited-for-rank",
                severity="info",
                cause="rank-computing",
                message=message,
                ranks=tuple(culprits),
                windows=(),
                evidence=_wait_evidence(waiting, waits),
                cost={"waited_s": total, "longest_wait_s": float(longest["seconds"])},
                fix=SNIPPETS["balance-ranks"],
            )
        )
    return findings
