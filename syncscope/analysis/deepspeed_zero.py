"""DeepSpeed's engine in DeepSpeed's words: ZeRO's deliberate per-micro-batch reductions and
the misuses of an engine that already accumulates and reduces by itself.

DeepSpeed counts micro-batches itself (``gradient_accumulation_steps`` in its config, one
``engine.backward`` and ``engine.step`` per micro-batch) and reduces inside
``engine.backward``: ZeRO 0-1 once, at its boundary; ZeRO 2-3 on every micro-batch, each rank
keeping only its partition (by design: DeepSpeed's source says stage >= 2 communicates off
the boundary). The rules here see a window through the engine recorded at capture
(``WrapperInfo`` of kind ``deepspeed``: its ZeRO stage and accumulation steps).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from syncscope.model import Fix, RankRun, Severity, SourceLocation, Window, WrapperInfo


@dataclass(frozen=True)
class Misuse:
    """One window's DeepSpeed-specific observation (diagnose makes it an Observation, with
    the sites of micro-batch ``position`` after ``sites``)."""

    kind: str
    severity: Severity
    cause: str
    evidence: dict[str, object]
    cost: dict[str, float]
    position: int
    fix: str
    sites: tuple[tuple[str, SourceLocation], ...] = ()


def engine(rank: RankRun) -> WrapperInfo | None:
    """The rank's DeepSpeed engine, if it ran one."""
    return next((w for w in rank.wrappers if w.kind == "deepspeed"), None)


def redundant_cause(rank: RankRun, window: Window, position: int) -> tuple[str, Severity]:
    """Why a DeepSpeed window reduced gradients before its last micro-batch."""
    info = engine(rank)
    last = len(window.micro_batches) - 1
    early = [c for c in window.grad_sync_collectives if c.micro_batch < last]
    if any(c.issuer == "user" for c in early):
        return "deepspeed-manual-all-reduce", "warning"
    if info is not None and (info.zero_stage or 0) >= 2:
        return "zero-partitioned-gradients", "info"
    gas = info.accumulation_steps if info is not None else None
    if gas and last + 1 > gas and (last + 1) % gas == 0:
        # DeepSpeed's boundary holds for every backward between the last two engine.step()
        # calls of a window: each of those backwards reduces
        return "deepspeed-step-every-n", "warning"
    return "deepspeed-reduced-before-boundary", "warning"  # what was seen, no known cause


def redundant_cost(rank: RankRun, window: Window, cause: str) -> dict[str, float]:
    """ZeRO-2/3's trade-off: what stage 1 would hold per rank to reduce once per window."""
    info = engine(rank)
    if cause != "zero-partitioned-gradients" or info is None:
        return {}
    world = max(info.shard_world, 1)
    return {"extra_memory_bytes_if_stage_1": int(info.param_bytes * (1 - 1 / world))}


def fix_for(cause: str) -> str:
    return {
        "zero-partitioned-gradients": "deepspeed-zero-stage",
        "deepspeed-manual-all-reduce": "deepspeed-manual-all-reduce",
        "deepspeed-step-every-n": "deepspeed-step",
    }.get(cause, "deepspeed")


def observations(rank: RankRun, window: Window) -> Iterator[Misuse]:
    """The DeepSpeed-only rules of one window: a manual reduction on the micro-batch DeepSpeed
    reduces (twice), ``engine.step()`` called once per N micro-batches, and ZeRO-2 with
    ``gradient_accumulation_steps`` 1 while the loop accumulates by hand."""
    info = engine(rank)
    if info is None or not window.micro_batches or not window.complete:
        return
    yield from _reduced_twice(rank, window)
    yield from _step_every_n(rank, window, info)


def _reduced_twice(rank: RankRun, window: Window) -> Iterator[Misuse]:
    ours = {c.micro_batch for c in window.grad_sync_collectives if c.issuer == "deepspeed"}
    manual = [
        c for c in window.grad_sync_collectives if c.issuer == "user" and c.micro_batch in ours
    ]
    if not manual:
        return
    position = manual[0].micro_batch
    wasted_ns = sum(c.duration_ns for c in manual)
    yield Misuse(
        "redundant-sync",
        "warning",
        "deepspeed-reduced-twice",
        {
            "micro_batches": len(window.micro_batches),
            "micro_batch": position,
            "deepspeed_grad_sync_collectives": sum(
                1 for c in window.grad_sync_collectives if c.issuer == "deepspeed"
            ),
            "manual_grad_sync_collectives": len(manual),
        },
        {
            "wasted_bytes_per_window": sum(c.bytes for c in manual),
            "redundant_collectives_per_window": len(manual),
            "redundant_time_ns_per_window": wasted_ns,
            "share_of_window_time": min(1.0, wasted_ns / max(window.duration_ns, 1)),
            "window_ns": window.duration_ns,
        },
        position,
        "deepspeed-manual-all-reduce",
        tuple(("all_reduce", c.site) for c in manual[:1] if c.site),
    )


def _step_every_n(rank: RankRun, window: Window, info: WrapperInfo) -> Iterator[Misuse]:
    """More micro-batches in a window than DeepSpeed's accumulation steps: the loop calls
    ``engine.step()`` once per N micro-batches, so the boundary comes every N x gas."""
    gas = info.accumulation_steps or 0
    n = len(window.micro_batches)
    if gas < 1 or n <= gas or n % gas:
        return
    severity: Severity
    if gas == 1 and (info.zero_stage or 0) >= 2:
        # every engine.step() is a boundary: ZeRO-2 keeps only the last micro-batch's reduced
        # partition of each window: the others' gradients are lost
        kind, severity, cause, fix = (
            "grad-reset-mid-window",
            "error",
            "deepspeed-boundary-every-micro-batch",
            "deepspeed-gas",
        )
        cost: dict[str, float] = {"lost_share_of_gradient": (n - 1) / n}
    else:
        kind, severity, cause, fix = (
            "irregular-window",
            "warning",
            "deepspeed-step-every-n",
            "deepspeed-step",
        )
        cost = {"effective_batch_share": n / gas}
    yield Misuse(
        kind,
        severity,
        cause,
        {
            "micro_batches": n,
            "gradient_accumulation_steps": gas,
            "micro_batches_per_engine_step": n // gas,
            "zero_stage": info.zero_stage or 0,
        },
        cost,
        n - 1,
        fix,
    )


_CONFIG = """ds_config = {
    "train_micro_batch_size_per_gpu": micro_batch_size,
    "gradient_accumulation_steps": accum_steps,  # DeepSpeed counts the micro-batches
    "zero_optimization": {"stage": STAGE},
}
engine, optimizer, _, _ = deepspeed.initialize(
    model=model, config=ds_config, model_parameters=model.parameters()
)
for batch in loader:  # one micro-batch per iteration
    loss = engine(batch)
    engine.backward(loss)  # reduces at DeepSpeed's boundary (every micro-batch from ZeRO-2)
    engine.step()  # every micro-batch: a no-op but at the boundary"""

SNIPPETS: dict[str, Fix] = {
    "deepspeed": Fix(
        "deepspeed",
        "DeepSpeed accumulates for you: set gradient_accumulation_steps in the DeepSpeed "
        "config (or Accelerate's DeepSpeedPlugin / the Trainer's argument) and call "
        "engine.backward(loss) and engine.step() on every micro-batch; no no_sync(), no "
        "reduction or step gate by hand.",
        _CONFIG.replace("STAGE", "1"),
    ),
    "deepspeed-zero-stage": Fix(
        "deepspeed-zero-stage",
        "A deliberate ZeRO trade-off: from stage 2 each rank keeps only its partition of the "
        "gradients, so DeepSpeed reduces them on every micro-batch. Where memory allows, "
        'ZeRO stage 1 ("zero_optimization": {"stage": 1}) keeps whole gradients between '
        "micro-batches and reduces once per window, at the boundary.",
        _CONFIG.replace(
            '{"stage": STAGE},',
            '{"stage": 1},  # was 2 or 3: once per window, whole gradients held',
        ),
    ),
    "deepspeed-manual-all-reduce": Fix(
        "deepspeed-manual-all-reduce",
        "DeepSpeed already reduces (and averages) the gradients inside engine.backward(): "
        "remove the hand-written all_reduce of the gradients; there is no no_sync() to add.",
        _CONFIG.replace("STAGE", "stage"),
    ),
    "deepspeed-step": Fix(
        "deepspeed-step",
        "Call engine.step() after every engine.backward(): DeepSpeed counts its own "
        "micro-steps, so a step every N micro-batches makes its boundary come every "
        "N x gradient_accumulation_steps micro-batches. Change the accumulation in the "
        "config, not with a step gate.",
        _CONFIG.replace("STAGE", "stage"),
    ),
    "deepspeed-gas": Fix(
        "deepspeed-gas",
        "Set gradient_accumulation_steps in the DeepSpeed config to the micro-batches the "
        "loop accumulates and call engine.step() on every micro-batch: with it at 1, every "
        "step is a boundary, and ZeRO-2 keeps only the last micro-batch's gradients.",
        _CONFIG.replace("STAGE", "2"),
    ),
}
