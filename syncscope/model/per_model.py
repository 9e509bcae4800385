"""A window seen from each wrapped model, where a rank steps several (a GAN's D and G).

The principle holds per model: each model's gradients are reduced once per window, after the
last backward that gave *it* gradients. Two models stepped in one loop reduce twice per
window, once each, and that is right. So where a rank wraps two or more models (DDP models,
FSDP roots: ``fully_shard`` or FullyShardedDataParallel) and its backwards say which models
they gave gradients to (``MicroBatch.grads_of``), each model gets a *view* of the window: a
``Window`` holding only

- the micro-batches whose backward gave that model gradients (or whose forward armed its
  DDP reducer), numbered again from 0;
- its own reductions (``Collective.model``: the DDP model whose forward armed the reducer,
  the FSDP root whose param group reduce-scattered; a DDP backward in which several were
  armed counts for each of them), the collectives that reduce no gradients, and reductions
  no model can be named for (a hand all-reduce);
- its own sync toggles, and the window's gradient resets;

positions moved to that numbering. Every per-window rule then judges each view as it judges
the window of a one-model job. Anything else (one model, traces, older captures) has one
view: the window itself, with the label "".
"""

from __future__ import annotations

from dataclasses import replace

from syncscope.model import Collective, MicroBatch, RankRun, Window


def wrapped_models(rank: RankRun) -> list[str]:
    """The labels of the models (DDP models, FSDP roots) of a rank that wraps two or more,
    else []."""
    labels = [w.label for w in rank.wrappers if w.kind in ("ddp", "fsdp") and w.label]
    return labels if len(labels) >= 2 else []


def _belongs(mb: MicroBatch, label: str) -> bool:
    return label in (mb.grads_of or ()) or label in mb.armed


def _reduces_for(c: Collective, label: str, labels: list[str], window: Window) -> bool:
    if not c.grad_sync:
        return True
    if c.model in labels:
        return c.model == label
    if c.issuer == "ddp" and 0 <= c.micro_batch < len(window.micro_batches):
        armed = window.micro_batches[c.micro_batch].armed
        return label in armed or not armed
    return True


def model_views(rank: RankRun, window: Window) -> list[tuple[str, Window]]:
    """``[(model label, its view of the window)]``; ``[("", window)]`` when the rank has
    one model, or its backwards did not record whose gradients they changed."""
    labels = wrapped_models(rank)
    mbs = window.micro_batches
    if not labels or not mbs or any(mb.grads_of is None for mb in mbs):
        return [("", window)]
    views: list[tuple[str, Window]] = []
    for label in labels:
        own = [mb for mb in mbs if _belongs(mb, label)]
        if not own:
            continue
        old = [mb.index for mb in own]

        def before(position: int, old: list[int] = old) -> int:
            """How many of the model's micro-batches come before old ``position``."""
            return sum(1 for i in old if i < position)

        def at(position: int, old: list[int] = old) -> int:
            """The model's micro-batch at or last before old ``position``."""
            return max(0, sum(1 for i in old if i <= position) - 1)

        views.append(
            (
                label,
                replace(
                    window,
                    micro_batches=tuple(replace(mb, index=i) for i, mb in enumerate(own)),
                    collectives=tuple(
                        replace(c, micro_batch=at(c.micro_batch))
                        for c in window.collectives
                        if _reduces_for(c, label, labels, window)
                    ),
                    toggles=tuple(
                        replace(t, micro_batch=before(t.micro_batch))
                        for t in window.toggles
                        if t.module in ("", label) or t.module not in labels
                    ),
                    grad_resets=tuple(
                        replace(r, after_micro_batches=before(r.after_micro_batches))
                        for r in window.grad_resets
                    ),
                ),
            )
        )
    return views or [("", window)]


def grad_syncs_by_model(rank: RankRun, window: Window) -> dict[str, dict[str, object]]:
    """Per model of a several-model rank: its micro-batches, grad syncs (rounds) and where
    they ran, in its own numbering (empty for a one-model rank)."""
    out: dict[str, dict[str, object]] = {}
    for label, view in model_views(rank, window):
        if label:
            out[label] = {
                "micro_batches": len(view.micro_batches),
                "grad_syncs": view.grad_syncs,
                "grad_sync_micro_batches": view.grad_sync_micro_batches,
            }
    return out
