"""What a trace can say about several wrapped models stepped in one loop (a GAN's D and G).

A torch.profiler trace does not say which model a backward fed: DDP's bucket all-reduces
and FSDP's reduce-scatters carry no model name (FSDP2 names a module relative to its root,
"" for every root), and every model of a job reduces over the same process group. What it
does show is each round's *layout*: the sizes of the gradient reductions one backward ran,
which a model keeps from window to window (DDP's buckets once rebuilt, FSDP's flat groups).

So where every steady window of a rank holds the same two or more layouts, each on a
backward of its own, the trace shows several models, and each layout's rounds per window are
counted; the windows are still judged as a whole (which micro-batches fed which model, and a
model that never reduced, cannot be told from a trace), and the note says so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from syncscope.model import Window
from syncscope.text import human_bytes

Layout = tuple[int, ...]  # the sizes (bytes) of one backward's gradient reductions, sorted


def _rounds(window: Window) -> Counter[Layout]:
    by_micro: dict[int, list[int]] = {}
    for c in window.collectives:
        if c.grad_sync and c.phase == "backward":
            by_micro.setdefault(c.micro_batch, []).append(c.bytes)
    return Counter(tuple(sorted(sizes)) for sizes in by_micro.values())


def model_layouts(windows: Sequence[Window]) -> dict[Layout, list[int]] | None:
    """Per layout, its rounds in each steady window (complete ones after the first), where
    every such window holds the same two or more layouts; else None."""
    steady = [w for w in windows if w.complete][1:]
    if len(steady) < 2:
        return None
    rounds = [_rounds(w) for w in steady]
    layouts = set(rounds[0])
    if len(layouts) < 2 or any(set(r) != layouts for r in rounds):
        return None
    return {layout: [r[layout] for r in rounds] for layout in sorted(layouts)}


def several_models_note(layouts: dict[Layout, list[int]]) -> str:
    """One line: the layouts, their rounds per window, and what the trace cannot tell."""
    parts = []
    for layout, counts in layouts.items():
        per = sorted(set(counts))
        times = str(per[0]) if len(per) == 1 else f"{per[0]}-{per[-1]}"
        parts.append(f"{human_bytes(sum(layout))} reduced {times}x per window")
    return (
        f"the trace shows {len(layouts)} distinct gradient reductions per window, each in a "
        f"backward of its own ({'; '.join(parts)}): likely {len(layouts)} wrapped models. A "
        "trace does not say which model a backward fed, so grad syncs are judged per window, "
        "not per model; `syncscope profile` counts and judges them per model"
    )
