"""``pytorch_lightning`` callback (the standalone package): grad syncs per window in ``fit()``.

::

    from syncscope.integrations.pytorch_lightning import SyncscopeCallback

    sync_check = SyncscopeCallback(max_grad_syncs_per_window=1)
    trainer = pl.Trainer(strategy="ddp", accumulate_grad_batches=4, callbacks=[sync_check])
    trainer.fit(model, loader)  # AssertionError with assert_syncs's message when over the limit
    print(sync_check.stats.grad_syncs_per_window)  # [1, 1, ...]

Tracking starts at ``on_fit_start`` (the model is wrapped, the process group is up) and ends
at ``on_fit_end`` on every rank, where the ranks' events are gathered and the limits
checked; an exception during ``fit()`` ends it at ``on_exception`` (hooks removed, nothing
gathered or checked). Importing this module imports pytorch_lightning. For the unified
``lightning`` package use ``syncscope.integrations.lightning``.
"""

from __future__ import annotations

from pytorch_lightning import Callback

from syncscope.integrations._tracker import LightningHooks


class SyncscopeCallback(LightningHooks, Callback):
    """Count gradient syncs per optimizer-step window during ``Trainer.fit()``.

    Keyword arguments: ``max_grad_syncs_per_window`` (int), ``grad_syncs_per_window`` (int
    or list), ``at_micro_batch`` (0-based position(s), negative from the end): fail the fit
    with ``AssertionError`` when broken; ``gather`` (default True). ``.stats`` is the
    ``syncscope.Stats`` of the current or last fit.
    """


__all__ = ["SyncscopeCallback"]
