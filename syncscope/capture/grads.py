"""What a tensor about to be reduced holds, and what a wrapper will reduce: probes of the
gradients themselves, used where storage and flags alone cannot tell."""

from __future__ import annotations

from typing import Any

import torch

_CONTENT_PROBES = 8  # gradients (or elements of one) compared per candidate tensor


def holds_grads(t: torch.Tensor, grads: list[torch.Tensor], grad_ptrs: set[int]) -> bool:
    """Whether ``t`` holds the values of the gradients, flattened in parameter order (all of
    them) or of one gradient: probed at a few spread positions, which must match exactly,
    with at least one non-zero. Sizes alone decide nothing: a loss of one element has the
    size of a bias gradient but not its value."""
    if t.untyped_storage().data_ptr() in grad_ptrs or t.numel() == 0:
        return False
    flat = t.detach().reshape(-1)
    total = sum(g.numel() for g in grads)
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    if flat.numel() == total and all(g.dtype == t.dtype and g.device == t.device for g in grads):
        offsets = [0]
        for g in grads[:-1]:
            offsets.append(offsets[-1] + g.numel())
        stride = max(1, len(grads) // _CONTENT_PROBES)
        for i in range(0, len(grads), stride):
            g = grads[i].detach().reshape(-1)
            at = torch.tensor([offsets[i], offsets[i] + g.numel() - 1], device=t.device)
            pairs.append((flat.index_select(0, at), g[[0, -1]]))
    else:
        same = [g for g in grads if g.numel() == flat.numel() and g.dtype == t.dtype]
        for g in same[:_CONTENT_PROBES]:
            if g.device != t.device:
                continue
            step = max(1, flat.numel() // _CONTENT_PROBES)
            candidate = g.detach().reshape(-1)
            if torch.equal(flat[::step], candidate[::step]) and bool(flat[::step].any()):
                return True
        return False
    if not pairs:
        return False
    mine = torch.cat([a for a, _ in pairs])
    theirs = torch.cat([b for _, b in pairs])
    return torch.equal(mine, theirs) and bool(mine.any())


def fsdp_reduce_grads(state: Any) -> bool:
    """FSDP2: whether the root's param groups will reduce gradients at the next backward."""
    ctx = getattr(state, "_state_ctx", None)
    states = list(getattr(ctx, "all_states", None) or [state])
    flags = [
        bool(getattr(group, "reduce_grads", True))
        for s in states
        for group in getattr(s, "_fsdp_param_groups", ())
    ]
    return all(flags) if flags else True


def deepspeed_reduce_grads(engine: Any) -> bool:
    """Whether the engine's next backward reduces gradients: at its boundary, or always
    from ZeRO-2 on (each rank keeps only its partition of the gradients)."""
    try:
        return int(engine.zero_optimization_stage()) >= 2 or bool(
            engine.is_gradient_accumulation_boundary()
        )
    except Exception:
        return True
