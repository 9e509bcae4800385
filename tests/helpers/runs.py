"""Hand-built runs and findings for renderer tests: no torch, no processes, just the model.

``make_run`` lays out ranks x windows x micro-batches on a simple clock (each micro-batch
1 ms, optimizer step 0.2 ms) and puts grad syncs where ``sync_at(rank, window, mb)`` says.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from syncscope.model import (
    Collective,
    Finding,
    Fix,
    MicroBatch,
    RankRun,
    Run,
    RunMeta,
    SourceLocation,
    Window,
    WrapperInfo,
)

MB_NS = 1_000_000
STEP_NS = 200_000
BUCKET_BYTES = 25 * 1024 * 1024
XSS = "<img src=x onerror=alert(1)>"
SCRIPT = "train.py"

SyncAt = Callable[[int, int, int, int], bool]  # (rank, window, mb, micro_batches) -> sync?


def last_only(rank: int, window: int, mb: int, n: int) -> bool:
    return mb == n - 1


def every(rank: int, window: int, mb: int, n: int) -> bool:
    return True


def _window(
    rank: int,
    index: int,
    start: int,
    n: int,
    sync_at: SyncAt,
    buckets: int,
    overlap: bool,
    site: SourceLocation,
    module: str,
) -> Window:
    mbs: list[MicroBatch] = []
    colls: list[Collective] = []
    t = start
    for m in range(n):
        mbs.append(MicroBatch(m, t, t + MB_NS, "ddp", m == n - 1, None, forward_site=site))
        if sync_at(rank, index, m, n):
            for b in range(buckets):
                s = t + MB_NS // 2 + b * 100_000
                colls.append(
                    Collective(
                        seq=len(colls),
                        op="all_reduce",
                        raw_op="c10d.allreduce_",
                        bytes=BUCKET_BYTES,
                        dtype="float32",
                        group_ranks=None,
                        group_name="0",
                        start_ns=s,
                        end_ns=s + 20_000,
                        done_ns=s + 300_000,
                        phase="backward",
                        micro_batch=m,
                        grad_sync=True,
                        issuer="ddp",
                        bucket=b,
                        module=module,
                    )
                )
        t += MB_NS
    end = t + STEP_NS
    comm = sum(c.duration_ns for c in colls)
    return Window(
        index=index,
        complete=True,
        start_ns=start,
        end_ns=end,
        micro_batches=tuple(mbs),
        collectives=tuple(colls),
        step_ns=STEP_NS,
        peak_memory_bytes=(512 + 8 * index % 3 + rank) * 1024 * 1024,
        comm_ns=comm if overlap else None,
        exposed_comm_ns=comm // 3 if overlap else None,
        compute_ns=n * MB_NS if overlap else None,
    )


def make_run(
    *,
    ranks: int = 2,
    windows: int = 4,
    micro_batches: int = 4,
    sync_at: SyncAt = last_only,
    buckets: int = 2,
    overlap: bool = False,
    command: tuple[str, ...] = ("torchrun", "--nproc-per-node=2", SCRIPT),
    notes: tuple[str, ...] = (),
    shared_ranks: bool = False,
    module: str = "DistributedDataParallel(Sequential)#0",
) -> Run:
    """``shared_ranks``: every rank but rank 1 reuses rank 0's windows (cheap 1,024-rank runs)."""
    site = SourceLocation(command[-1], 42, "train")
    span = micro_batches * MB_NS + STEP_NS

    def windows_of(rank: int) -> tuple[Window, ...]:
        return tuple(
            _window(rank, w, w * span, micro_batches, sync_at, buckets, overlap, site, module)
            for w in range(windows)
        )

    first = windows_of(0)
    rank_runs = [
        RankRun(
            rank=r,
            windows=first if (shared_ranks and r != 1) or r == 0 else windows_of(r),
            wrappers=(WrapperInfo("ddp", "DistributedDataParallel(Sequential)#0", 1000, 4000),),
            backend="gloo",
        )
        for r in range(ranks)
    ]
    meta = RunMeta(
        command=command,
        world_size=ranks,
        created="2025-01-01T00:00:00Z",
        syncscope_version="0.1.0",
        torch_version="2.13.0",
        notes=notes,
    )
    return Run(meta=meta, ranks=tuple(rank_runs))


def clean_ddp() -> Run:
    """2 ranks x 4 windows x 4 micro-batches, one sync per window on the last micro-batch."""
    return make_run()


def redundant() -> Run:
    """Pattern 1: every micro-batch all-reduces; 3 of 4 syncs per window are waste."""
    return make_run(sync_at=every)


def divergent() -> Run:
    """Rank 1 syncs on micro-batch 0 instead of the last (pattern 7, one rank)."""
    return make_run(sync_at=lambda r, w, m, n: m == (0 if r == 1 else n - 1))


def medium(ranks: int = 8, windows: int = 100) -> Run:
    """8 ranks x 100 windows, redundant syncs on 4 buckets: the page-size budget case."""
    return make_run(ranks=ranks, windows=windows, sync_at=every, buckets=4)


@functools.cache
def huge() -> Run:
    """1,024 ranks x 50 windows; rank 1 misses its sync in odd windows."""
    return make_run(
        ranks=1024,
        windows=50,
        sync_at=lambda r, w, m, n: m == n - 1 and not (r == 1 and w % 2),
        buckets=1,
        shared_ranks=True,
    )


def traced() -> Run:
    """Trace data present: comm_ns, exposed_comm_ns and compute_ns set on every window."""
    return make_run(sync_at=every, overlap=True)


def malicious() -> Run:
    """A script named like an HTML tag, in the command, notes and (via findings) sources."""
    return make_run(
        command=("python", f"{XSS}.py", "--name", "</script><script>alert(2)</script>"),
        notes=(f"trace of {XSS}.py had no memory events",),
        module=f"{XSS}Block",
    )


REDUNDANT_SNIPPET = """\
for i, batch in enumerate(loader):
    last = (i + 1) % accum == 0
    ctx = contextlib.nullcontext() if last else model.no_sync()
    with ctx:
        loss = model(batch).loss / accum
        loss.backward()
    if last:
        opt.step()
        opt.zero_grad()
"""

KINDS = (
    ("redundant-sync", "warning"),
    ("missing-sync", "error"),
    ("rank-divergence", "error"),
    ("grad-reset-mid-window", "error"),
    ("irregular-window", "warning"),
    ("fragmented-sync", "warning"),
    ("unsharded-grad-memory", "info"),
    ("collective-mismatch", "error"),
    ("hang", "error"),
    ("exposed-communication", "info"),
)


def finding(
    kind: str = "redundant-sync",
    severity: str = "warning",
    *,
    script: str = SCRIPT,
    ranks: tuple[int, ...] = (0, 1),
    windows: tuple[int, ...] = (0, 1, 2, 3),
    cause: str = "no-no_sync",
) -> Finding:
    site = SourceLocation(script, 57, "train_step")
    return Finding(
        kind=kind,
        severity=severity,  # type: ignore[arg-type]
        cause=cause,
        message=f"{kind}: 3 of 4 grad syncs per window are redundant ({script})",
        ranks=ranks,
        windows=windows,
        evidence={
            "syncs_per_window": 4,
            "expected_syncs_per_window": 1,
            "sync_micro_batches": [0, 1, 2, 3],
            "wrapper": "ddp",
            "module": f"{XSS}Block",
            "new_evidence_key": {"nested": 1},
        },
        cost={
            "wasted_bytes_per_window": 3 * 2 * BUCKET_BYTES,
            "redundant_time_ns_per_window": 1_800_000,
            "share_of_window_time": 0.43,
            "projected_window_ns": 2_400_000,
            "a_cost_key_nobody_planned": 7,
        },
        sites=(("backward", site), ("optimizer step", SourceLocation(script, 61, "train_step"))),
        fix=Fix(
            "ddp-no_sync", f"Skip the sync on non-last micro-batches in {script}", REDUNDANT_SNIPPET
        ),
    )


def all_findings(script: str = SCRIPT) -> list[Finding]:
    return [finding(k, s, script=script, cause=k) for k, s in KINDS]
