"""``syncscope.track()``: count gradient syncs per window inside a running process.

::

    with syncscope.track() as stats:
        train_one_epoch(model, optimizer, loader)
    assert stats.grad_syncs_per_window == [1, 1, 1]

Works in any process, with or without a process group (DDP with world size 1 still
all-reduces). On exit, when a process group of several ranks is up, every rank's events are
gathered over a separate gloo group so ``stats.findings`` can compare ranks; all ranks must
then leave ``track()`` together, as they entered it.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import threading
from typing import Any

from syncscope.analysis.diagnose import diagnose
from syncscope.capture.recorder.core import MemorySink
from syncscope.capture.session import CaptureSession
from syncscope.load.runs import build_run
from syncscope.model import Finding, Run, RunMeta, Verdict, verdict_of
from syncscope.render.json_report import figures_dict, window_dict


class Stats:
    """What ``track()`` saw. Live while tracking; final (all ranks) after the block exits.

    - ``rank``, ``world_size``: this process's place in the default process group (0, 1
      without one).
    - ``windows``: this rank's windows (micro-batches ending in one optimizer step, plus a
      trailing incomplete one), each a dict with the fields of report.json windows.
    - ``grad_syncs_per_window``: grad-sync rounds in each complete window.
    - ``findings``: the diagnoses (``syncscope.model.Finding``), every rank's after exit.
    - ``verdict``: ``clean``, ``warnings``, ``errors``, or ``failed`` when a rank crashed,
      was killed or hung (a ``run-failed`` or ``hang`` finding).
    - ``run``: the full run model.
    """

    def __init__(self, sink: MemorySink | None, rank: int, world_size: int) -> None:
        self._sink = sink
        self.rank = rank
        self.world_size = world_size
        self._run: Run | None = None
        self._findings: list[Finding] | None = None

    @classmethod
    def from_run(cls, run: Run, rank: int = 0) -> Stats:
        """Stats of a finished run (``syncscope.load.runs.load_run(run_dir)``, or a
        hand-built one), seen from ``rank``: assert on a ``syncscope profile`` run too."""
        stats = cls(None, rank, run.world_size)
        stats._finish(run)
        return stats

    def _finish(self, run: Run) -> None:
        self._run = run
        self._findings = diagnose(run)

    @property
    def run(self) -> Run:
        """The run model: this rank only while tracking, every rank after exit."""
        if self._run is not None:
            return self._run
        meta = RunMeta(world_size=self.world_size, command=("track()",))
        events = list(self._sink.events) if self._sink is not None else []
        return build_run(meta, {self.rank: events})

    @property
    def windows(self) -> list[dict[str, Any]]:
        """This rank's windows, with the same fields as report.json windows."""
        rank = self.run.rank(self.rank) or (self.run.ranks[0] if self.run.ranks else None)
        return [window_dict(w, rank) for w in rank.windows] if rank else []

    @property
    def figures(self) -> dict[str, Any]:
        """Window time, communication time, bytes, memory and the projected gain, as
        report.json's ``figures`` (one definition everywhere: ``syncscope.model.figures``)."""
        return figures_dict(self.run, self.findings)

    @property
    def grad_syncs_per_window(self) -> list[int]:
        """Grad-sync rounds (reductions of the gradient set) per complete window."""
        return [w["grad_syncs"] for w in self.windows if w["complete"]]

    @property
    def findings(self) -> list[Finding]:
        if self._findings is not None:
            return self._findings
        # still tracking: the rank has not ended yet, so "no exit record" is no failure
        return [f for f in diagnose(self.run) if f.kind != "run-failed"]

    @property
    def verdict(self) -> Verdict:
        """``clean``, ``warnings``, ``errors`` or ``failed`` (the run did not end normally)."""
        return verdict_of(self.findings)

    def __repr__(self) -> str:
        return (
            f"Stats(rank={self.rank}, world_size={self.world_size}, "
            f"grad_syncs_per_window={self.grad_syncs_per_window})"
        )


def _process_group() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _gather(events: list[dict[str, Any]], world_size: int) -> dict[int, list[dict[str, Any]]]:
    import torch.distributed as dist

    from syncscope.capture.hooks.collectives import unrecorded

    with unrecorded():  # syncscope's own collectives: a capture around this one skips them
        group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=120))
        try:
            gathered: list[Any] = [None] * world_size
            dist.all_gather_object(gathered, events, group=group)
        finally:
            dist.destroy_process_group(group)
    return {rank: list(ev or []) for rank, ev in enumerate(gathered)}


def track(*, gather: bool = True) -> Track:
    """Record every collective, micro-batch and optimizer step in the block.

    ``gather=False`` keeps each rank's view local (no collective at exit). Gathering happens
    only when the block exits normally and a process group of several ranks is still up.
    An exception inside the block propagates unchanged; the hooks are removed either way.
    """
    return Track(gather=gather)


_open: list[Track] = []  # the blocks entered and not yet exited, in this process
_open_lock = threading.Lock()


class Track:
    """A ``track()`` block. Entering it starts recording and returns the ``Stats``;
    leaving it removes the hooks and finishes them. The same object may be entered again
    once it has exited (a new block, new ``Stats``), not while it is open. Blocks in one
    thread may nest or overlap (each sees what happens while it is open); a block in a
    second thread while one is open in another is refused: the hooks see the whole process,
    so each block would count the other thread's collectives and steps. A block never
    exited (``__enter__()`` alone) records until the interpreter exits, then closes."""

    def __init__(self, *, gather: bool = True) -> None:
        self.gather = gather
        self._state: tuple[CaptureSession, MemorySink, Stats] | None = None
        self._thread = 0

    def __enter__(self) -> Stats:
        if self._state is not None:
            raise RuntimeError(
                "this track() block is open already: a block nested inside it needs a "
                "track() of its own (with syncscope.track() as inner: ...)"
            )
        _claim(self)
        try:
            rank, world_size = _process_group()
            session, sink = CaptureSession.in_memory(rank=rank, world_size=world_size)
            stats = Stats(sink, rank, world_size)
            session.start()
        except BaseException:
            _release(self)
            raise
        self._state = (session, sink, stats)
        return stats

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        state, self._state = self._state, None
        if state is None:
            return
        _release(self)
        session, sink, stats = state
        failed = kind is not None
        session.close(1 if failed else 0, "exception" if failed else "finished")
        if failed:
            with contextlib.suppress(Exception):  # never mask the user's exception
                _finish(stats, sink, gather=False)
        else:
            _finish(stats, sink, gather=self.gather)


def _claim(block: Track) -> None:
    """Count ``block`` open in this thread; refuse it while another thread has one open."""
    me = threading.get_ident()
    with _open_lock:
        other = next((b for b in _open if b._thread != me), None)
        if other is not None:
            names = {t.ident: t.name for t in threading.enumerate()}
            raise RuntimeError(
                f"syncscope.track() is open in another thread "
                f"({names.get(other._thread, 'ended')!r}): its hooks see the whole process, "
                "so each block would count the other thread's collectives and steps; open "
                "one block around both threads' work, or track them one after the other"
            )
        if not _open:
            atexit.register(_close_open)
        block._thread = me
        _open.append(block)


def _release(block: Track) -> None:
    with _open_lock:
        if block in _open:
            _open.remove(block)
        if not _open:
            atexit.unregister(_close_open)


def _close_open() -> None:
    """At the interpreter's exit: close blocks never exited (hooks removed while every
    module is still there; nothing gathered)."""
    for block in reversed(list(_open)):
        with contextlib.suppress(Exception):
            block.gather = False
            block.__exit__(None, None, None)


def _finish(stats: Stats, sink: MemorySink, *, gather: bool) -> None:
    live_rank, live_world = _process_group()
    if live_world > 1 or stats.world_size == 1:  # still up, or created inside the block
        stats.rank, stats.world_size = live_rank, live_world
    events = list(sink.events)
    by_rank = {stats.rank: events}
    gathered = gather and live_world > 1
    if gathered:
        by_rank = _gather(events, live_world)
    meta = RunMeta(world_size=stats.world_size, command=("track()",), one_rank_view=not gathered)
    stats._finish(build_run(meta, by_rank))
