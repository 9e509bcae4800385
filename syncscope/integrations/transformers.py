"""Hugging Face ``Trainer`` callback: gradient syncs per window during ``train()``.

::

    from syncscope.integrations.transformers import SyncscopeCallback

    sync_check = SyncscopeCallback(max_grad_syncs_per_window=1)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[sync_check])
    trainer.train()  # AssertionError with assert_syncs's message when over the limit
    print(sync_check.stats.grad_syncs_per_window)  # [1, 1, ...]

Tracking starts at ``on_train_begin`` (the model is prepared, the process group is up) and
ends at ``on_train_end`` on every rank, where the ranks' events are gathered and the limits
checked. The Trainer has no exception event: when ``train()`` raises, the next
``on_train_begin`` of this callback, or ``close()``, ends the stale tracking (hooks removed,
nothing gathered or checked). Importing this module imports transformers.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from syncscope.integrations._tracker import SyncTracker


class SyncscopeCallback(SyncTracker, TrainerCallback):
    """Count gradient syncs per optimizer-step window during ``Trainer.train()``.

    Keyword arguments: ``max_grad_syncs_per_window`` (int), ``grad_syncs_per_window`` (int
    or list), ``at_micro_batch`` (0-based position(s), negative from the end): fail
    ``train()`` with ``AssertionError`` when broken; ``gather`` (default True). ``.stats``
    is the ``syncscope.Stats`` of the current or last ``train()``.
    """

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.begin(state)  # listed twice: called twice with this train()'s state

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.end()


__all__ = ["SyncscopeCallback"]
