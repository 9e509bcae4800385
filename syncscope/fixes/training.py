"""Did the fixed script train as the original did? The parameters compared, window by window.

``fix --verify`` runs both scripts with parameter fingerprints on (see
``syncscope.capture.paramprint``): for every parameter an optimizer steps, before its first
step and after each step, the position-weighted sum of a fixed sample of its values
(``value``) and the norm of that weighted sample (``scale``). ``compare`` matches them rank by
rank, window by window, parameter by parameter, and returns the first that differs.

Tolerance. A rewrite that only removes redundant grad syncs changes the order of the
gradients' floating-point additions (each micro-batch reduced across ranks and then summed,
or summed and then reduced once), nothing else. Each gradient element then differs by a few
units in the last place (float32: ~1e-7 relative), the parameters by that times the
learning rate plus one rounding of the update, with signs that do not agree from element to
element; such differences move a weighted sum by about that relative size times its
``scale``. Two fingerprints match when both their values and their scales are within
``RTOL`` (1e-4) of the larger scale: a thousand times the float32 reduction-order noise of
a few hundred steps, where a change of training (a micro-batch dropped or counted twice, a
gradient scaled, ranks left unsynced) moves parameters by a fraction of an update, 1e-3 and
more of their size. Half-precision parameters round every update to 2^-11 (float16) or 2^-8
(bfloat16): their tolerance is that precision. Pure: reads the run model only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from syncscope.model import ParamPrint, Run

RTOL = 1e-4  # float32 and float64 parameters
RTOL_HALF = {"float16": 2.0**-10, "bfloat16": 2.0**-7}  # two units in the last place


@dataclass(frozen=True)
class RankTraining:
    """What one rank's parameters held: before the first step, and after each complete
    window's step(s) (window index, fingerprints)."""

    rank: int
    initial: tuple[ParamPrint, ...]
    windows: tuple[tuple[int, tuple[ParamPrint, ...]], ...]


@dataclass(frozen=True)
class ParamDifference:
    """The first parameter whose fingerprints differ: after window ``window``'s step (None:
    before the first step, where training starts), on ``rank``."""

    window: int | None
    rank: int
    name: str
    original: float
    fixed: float
    allowed: float  # the largest difference the tolerance allows there


@dataclass(frozen=True)
class TrainingComparison:
    """The verdict on training. ``windows``: windows compared on every rank; ``largest``:
    the largest difference seen, as a fraction of its scale (information: against ``RTOL``)."""

    windows: int = 0
    difference: ParamDifference | None = None
    steps: tuple[int, int] | None = None  # complete windows (original, fixed) when they differ
    reason: str = ""  # why nothing was compared
    largest: float = 0.0

    @property
    def status(self) -> str:
        """``match``, ``differ`` or ``not compared``."""
        if self.difference is not None or self.steps is not None:
            return "differ"
        return "match" if self.windows else "not compared"


def training_of(run: Run) -> tuple[RankTraining, ...]:
    """Each rank's parameter fingerprints, from the run model."""
    return tuple(
        RankTraining(
            rank.rank,
            rank.initial_params,
            tuple((w.index, w.params) for w in rank.windows if w.complete),
        )
        for rank in run.ranks
    )


def tolerance(a: ParamPrint, b: ParamPrint) -> float:
    """The largest difference of value (and of scale) that two fingerprints may show."""
    return RTOL_HALF.get(a.dtype, RTOL) * max(a.scale, b.scale)


def same(a: ParamPrint, b: ParamPrint) -> bool:
    """Whether two fingerprints of a parameter match within ``tolerance`` (not finite: where
    both are)."""
    if any(math.isnan(x) for x in (a.value, a.scale, b.value, b.scale)):
        return (math.isnan(a.value), math.isnan(a.scale)) == (
            math.isnan(b.value),
            math.isnan(b.scale),
        )
    allowed = tolerance(a, b)
    return abs(a.value - b.value) <= allowed and abs(a.scale - b.scale) <= allowed


def compare(original: Sequence[RankTraining], fixed: Sequence[RankTraining]) -> TrainingComparison:
    """The first parameter that differs between the runs (starting point first, then window
    by window, rank by rank, in the optimizers' order), or how many windows matched."""
    pairs = _pairs(original, fixed)
    if not pairs:
        return TrainingComparison(reason="no parameter fingerprints were recorded")
    largest = 0.0
    for a, b in pairs:
        first = _first_difference(None, a.rank, a.initial, b.initial)
        if first is not None:
            return TrainingComparison(difference=first)
    for a, b in pairs:
        if len(a.windows) != len(b.windows):
            return TrainingComparison(steps=(len(a.windows), len(b.windows)))
    count = min(len(a.windows) for a, _ in pairs)
    for i in range(count):
        for a, b in pairs:
            (index, before), (_, after) = a.windows[i], b.windows[i]
            first = _first_difference(index, a.rank, before, after)
            if first is not None:
                return TrainingComparison(i, first, largest=largest)
            largest = max(largest, _largest(before, after))
    if count and not any(a.windows[0][1] for a, _ in pairs):
        return TrainingComparison(reason="no parameter fingerprints were recorded")
    return TrainingComparison(count, largest=largest)


def _pairs(
    original: Sequence[RankTraining], fixed: Sequence[RankTraining]
) -> list[tuple[RankTraining, RankTraining]]:
    """The ranks both runs recorded parameters of, paired by rank."""
    by_rank = {r.rank: r for r in fixed}
    return [
        (a, by_rank[a.rank])
        for a in sorted(original, key=lambda r: r.rank)
        if a.rank in by_rank and (a.initial or any(p for _, p in a.windows))
    ]


def _first_difference(
    window: int | None, rank: int, before: Sequence[ParamPrint], after: Sequence[ParamPrint]
) -> ParamDifference | None:
    fixed = {p.name: p for p in after}
    for a in before:
        b = fixed.get(a.name)
        if b is None:
            return ParamDifference(window, rank, a.name, a.value, math.nan, 0.0)
        if not same(a, b):
            return ParamDifference(window, rank, a.name, a.value, b.value, tolerance(a, b))
    named = {p.name for p in before}
    for b in after:
        if b.name not in named:
            return ParamDifference(window, rank, b.name, math.nan, b.value, 0.0)
    return None


def _largest(before: Sequence[ParamPrint], after: Sequence[ParamPrint]) -> float:
    fixed = {p.name: p for p in after}
    worst = 0.0
    for a in before:
        b = fixed.get(a.name)
        scale = max(a.scale, b.scale) if b is not None else 0.0
        if b is not None and scale > 0 and not math.isnan(scale):
            worst = max(worst, abs(a.value - b.value) / scale, abs(a.scale - b.scale) / scale)
    return worst
