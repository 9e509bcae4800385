"""What a trace can say about several wrapped models stepped in one loop (a GAN's D and G).

A torch.profiler trace does not say which model a backward fed: DDP's bucket all-reduces
and FSDP's reduce-scatters carry no model name (FSDP2 names a module relative to its root,
"" for every root), and every model of a job reduces over the same process group. What it
does show is each round's *layout*: the sizes of the gradient reductions one backward ran,
which a model keeps from window to window (DDP's buckets once rebuilt, FSDP's flat groups).

So where every steady window of a rank holds the same two or more layouts, each on a
backward of its own, the trace shows several models. Each layout is then a model of its own
(labelled by its size): its reductions are that model's, a backward that ran one layout fed
that model, and a backward that reduced nothing (under ``no_sync()``, or a set flag) may
have fed any of them, so it counts for each. Every model is then judged as a one-model job
is (``syncscope.model.per_model``): reduced once per window, after its last backward. What
the trace cannot tell (which model a backward that reduced nothing fed, a model that never
reduced) the note says.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from syncscope.model import Window, Wrapper, WrapperInfo
from syncscope.text import human_bytes

Layout = tuple[int, ...]  # the sizes (bytes) of one backward's gradient reductions, sorted


def _by_micro_batch(window: Window) -> dict[int, Layout]:
    by_micro: dict[int, list[int]] = {}
    for c in window.collectives:
        if c.grad_sync and c.phase == "backward":
            by_micro.setdefault(c.micro_batch, []).append(c.bytes)
    return {mb: tuple(sorted(sizes)) for mb, sizes in by_micro.items()}


def _rounds(window: Window) -> Counter[Layout]:
    return Counter(_by_micro_batch(window).values())


def model_layouts(windows: Sequence[Window]) -> dict[Layout, list[int]] | None:
    """Per layout, its rounds in each steady window (complete ones after the first), where
    every such window holds the same two or more layouts; else None."""
    steady = [w for w in windows if w.complete][1:]
    if len(steady) < 2:
        return None
    first = _rounds(steady[0])
    layouts = set(first)
    if len(layouts) < 2:  # one model (as most jobs): the other windows need not be read
        return None
    rounds = [first, *map(_rounds, steady[1:])]
    if any(set(r) != layouts for r in rounds):
        return None
    return {layout: [r[layout] for r in rounds] for layout in sorted(layouts)}


def model_label(layout: Layout) -> str:
    """A model told apart by the gradients it reduces (a trace names none)."""
    return f"the model reducing {human_bytes(sum(layout))}"


def split_by_layout(
    windows: Sequence[Window], layouts: dict[Layout, list[int]], wrapper: Wrapper
) -> tuple[list[Window], tuple[WrapperInfo, ...]]:
    """The windows with each reduction and backward given its model (``Collective.model``,
    ``MicroBatch.grads_of``), and the models, one per layout. A window with a backward of
    another layout (DDP's first buckets, before their rebuild) is left whole."""
    labels = {layout: model_label(layout) for layout in layouts}
    everyone = tuple(labels.values())
    if len(set(everyone)) < len(everyone):  # two layouts of one total size: no name apart
        return list(windows), ()
    out: list[Window] = []
    for window in windows:
        ran = _by_micro_batch(window)
        if any(layout not in labels for layout in ran.values()):
            out.append(window)
            continue
        out.append(
            replace(
                window,
                micro_batches=tuple(
                    replace(mb, grads_of=(labels[ran[mb.index]],) if mb.index in ran else everyone)
                    for mb in window.micro_batches
                ),
                collectives=tuple(
                    replace(c, model=labels[ran[c.micro_batch]])
                    if c.grad_sync and c.phase == "backward" and c.micro_batch in ran
                    else c
                    for c in window.collectives
                ),
            )
        )
    return out, tuple(WrapperInfo(kind=wrapper, label=label) for label in everyone)


def several_models_note(layouts: dict[Layout, list[int]]) -> str:
    """One line: the layouts, their rounds per window, and what the trace cannot tell."""
    parts = []
    for layout, counts in layouts.items():
        per = sorted(set(counts))
        times = str(per[0]) if len(per) == 1 else f"{per[0]}-{per[-1]}"
        parts.append(f"{human_bytes(sum(layout))} reduced {times}x per window")
    return (
        f"the trace shows {len(layouts)} distinct gradient reductions per window, each in a "
        f"backward of its own ({'; '.join(parts)}): {len(layouts)} wrapped models, judged each "
        "on its own. A trace does not say which model a backward that reduced nothing fed "
        "(each counts for every model), nor shows a model that never reduced; "
        "`syncscope profile` records both"
    )
