"""Which ranks should hold the same gradients: replicas that differ by design (local SGD).

Under local SGD (torch's ``post_localSGD_hook`` with ``PeriodicModelAverager`` or a
hierarchical averager) DDP reduces the gradients inside subgroups only, after a warm-up,
and the parameters are averaged over a larger group every few steps: between averagings,
replicas agree inside a subgroup and differ across subgroups, as designed. That is read
from the run itself:

- a *local window*: on every rank, each grad sync of the window ran over one process group,
  smaller than the world, that holds the rank (its *reduction group*);
- *averaging*: on some rank, a floating-point all-reduce that is no grad sync, over a group
  larger than the rank's reduction group and holding it, at least as large in bytes as the
  gradients the rank reduced in a window (the flattened parameters).

Both seen: the run is local SGD. Its local windows compare gradients inside each reduction
group (``syncscope.load.runs.compare_fingerprints``), and a divergence inside a group is still
one. Reductions inside subgroups with no averaging anywhere are not local SGD: replicas that
never meet again are compared over the world, as in any window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from syncscope.model import Collective, RankRun, Window


@dataclass(frozen=True, slots=True)
class LocalSGD:
    """What a local-SGD run showed."""

    # local windows, by position in the ranks' window lists -> the reduction groups
    groups: dict[int, tuple[tuple[int, ...], ...]]
    averaging_windows: tuple[int, ...]  # windows holding a parameter averaging
    averaging_group_sizes: tuple[int, ...]


def _reduction_group(rank: int, window: Window, world: int) -> tuple[int, ...] | None:
    groups = {c.group_ranks for c in window.collectives if c.grad_sync}
    if len(groups) != 1:
        return None
    (group,) = groups
    if group is None or rank not in group or len(group) >= world:
        return None
    return group


def _averages(c: Collective, group: tuple[int, ...], reduced_bytes: int) -> bool:
    return (
        c.op == "all_reduce"
        and not c.grad_sync
        and c.group_ranks is not None
        and len(c.group_ranks) > len(group)
        and set(group) <= set(c.group_ranks)
        and "float" in c.dtype.lower()
        and c.bytes >= reduced_bytes > 0
    )


def local_sgd(ranks: Sequence[RankRun], world: int) -> LocalSGD | None:
    """The run's local-SGD windows and averagings, or None when it is no local SGD."""
    if len(ranks) < 2:
        return None
    count = max(len(r.windows) for r in ranks)
    groups: dict[int, tuple[tuple[int, ...], ...]] = {}
    for i in range(count):
        found: set[tuple[int, ...]] = set()
        for r in ranks:
            w = r.windows[i] if i < len(r.windows) else None
            if w is None or not w.complete:
                continue
            group = _reduction_group(r.rank, w, world)
            if group is None:
                break
            found.add(group)
        else:
            if found:
                groups[i] = tuple(sorted(found))
    if not groups:
        return None
    averaging: dict[int, set[int]] = {}
    for r in ranks:
        mine = [_reduction_group(r.rank, w, world) for w in r.windows]
        group = next((g for g in mine if g is not None), None)
        if group is None:
            continue
        reduced = max(
            (w.grad_sync_bytes for w, g in zip(r.windows, mine, strict=True) if g is not None),
            default=0,
        )
        for w in r.windows:
            for c in w.collectives:
                if _averages(c, group, reduced):
                    averaging.setdefault(w.index, set()).add(len(c.group_ranks or ()))
    if not averaging:
        return None
    return LocalSGD(
        groups=groups,
        averaging_windows=tuple(sorted(averaging)),
        averaging_group_sizes=tuple(sorted({s for sizes in averaging.values() for s in sizes})),
    )
