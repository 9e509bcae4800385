"""What every framework callback shares: ``track()`` opened at the start of training, closed
at its end, and the limits checked with ``assert_syncs``'s rules and message.

No framework (and no torch) is imported here; the submodules add the framework's hooks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from syncscope.testing.asserts import check, explain, validate

if TYPE_CHECKING:
    from syncscope.testing.track import Stats


class SyncTracker:
    """Tracks gradient syncs per window between ``begin()`` and ``end()``.

    ``max_grad_syncs_per_window``, ``grad_syncs_per_window`` and ``at_micro_batch`` are
    ``assert_syncs``'s ``max_per_window``, ``per_window`` and ``at_micro_batch`` (the names
    of the pytest marker); with none of them the callback only records. An error finding
    fails a check unless ``allow_errors`` (as ``assert_syncs``). ``gather=False``
    keeps each rank's view local (no collective at the end).
    """

    def __init__(
        self,
        *,
        max_grad_syncs_per_window: int | None = None,
        grad_syncs_per_window: int | Sequence[int] | None = None,
        at_micro_batch: int | Sequence[int] | None = None,
        gather: bool = True,
        allow_errors: bool = False,
    ) -> None:
        validate(grad_syncs_per_window, max_grad_syncs_per_window, at_micro_batch)
        self.max_grad_syncs_per_window = max_grad_syncs_per_window
        self.grad_syncs_per_window = grad_syncs_per_window
        self.at_micro_batch = at_micro_batch
        self.gather = gather
        self.allow_errors = allow_errors
        self._tracking: contextlib.AbstractContextManager[Stats] | None = None
        self._stats: Stats | None = None
        self._run: object = None

    @property
    def stats(self) -> Stats:
        """The ``Stats`` of the current or last training run: live while it runs, final
        (every rank's events, when gathered) after it ended."""
        if self._stats is None:
            raise RuntimeError(
                f"syncscope: {type(self).__name__} has no stats yet: no training has started "
                "with this callback (pass it in the trainer's callbacks)"
            )
        return self._stats

    @property
    def tracking(self) -> bool:
        """Whether a training run is being tracked now."""
        return self._tracking is not None

    def _expectations(self) -> dict[str, Any]:
        return {
            "per_window": self.grad_syncs_per_window,
            "max_per_window": self.max_grad_syncs_per_window,
            "at_micro_batch": self.at_micro_batch,
        }

    def begin(self, run: object = None) -> None:
        """Start tracking (the framework's start-of-training hook). ``run``: an object of
        this training run (the HF Trainer's state): a second call for the same run, as when
        one callback instance is listed twice, changes nothing."""
        if self._tracking is not None and run is not None and run is self._run:
            return
        if self._tracking is not None:  # the last run ended by an exception nobody reported
            self.close()
        self._run = run
        from syncscope.testing.track import track

        tracking = track(gather=self.gather)
        self._stats = tracking.__enter__()
        self._tracking = tracking

    def end(self) -> None:
        """Stop tracking (the framework's end-of-training hook; every rank must reach it,
        as with ``track()``), then raise AssertionError, with ``assert_syncs``'s message,
        when a limit is broken."""
        tracking, self._tracking = self._tracking, None
        if tracking is None:
            return
        tracking.__exit__(None, None, None)
        expect = self._expectations()
        problems = check(self.stats, **expect, allow_errors=self.allow_errors)
        if problems:
            raise AssertionError(explain(self.stats, problems, **expect))

    def close(self, exception: BaseException | None = None) -> None:
        """End tracking after a failure (or a training run that never reached its end hook):
        the hooks are removed, nothing is gathered, nothing is checked, and ``stats.verdict``
        is ``failed``. Does nothing when not tracking."""
        tracking, self._tracking = self._tracking, None
        if tracking is None:
            return
        exc = exception or RuntimeError("training ended without its end-of-training hook")
        with contextlib.suppress(BaseException):  # track() re-raises what it is given
            tracking.__exit__(type(exc), exc, exc.__traceback__)


class LightningHooks(SyncTracker):
    """The Lightning hooks, for ``lightning.pytorch`` and ``pytorch_lightning`` alike."""

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.begin()

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.end()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.close(exception)
