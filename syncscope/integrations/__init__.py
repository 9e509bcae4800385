"""Framework callbacks: count gradient syncs per window during ``fit()`` / ``train()``.

Each callback runs ``syncscope.track()`` from the start of training to its end in the
process it is attached to, exposes the same ``Stats`` (``callback.stats``), and fails the
run with the ``assert_syncs`` message when a limit is broken::

    # Lightning (lightning.pytorch)
    from syncscope.integrations.lightning import SyncscopeCallback

    trainer = L.Trainer(..., accumulate_grad_batches=4, callbacks=[SyncscopeCallback(
        max_grad_syncs_per_window=1)])

    # the standalone pytorch_lightning package
    from syncscope.integrations.pytorch_lightning import SyncscopeCallback

    # Hugging Face Trainer
    from syncscope.integrations.transformers import SyncscopeCallback

    Trainer(..., callbacks=[SyncscopeCallback(max_grad_syncs_per_window=1)])

This package imports neither Lightning nor transformers (nor torch): each framework is
imported by its own submodule, when that submodule is imported. docs/testing-api.md,
"Framework callbacks".
"""

from __future__ import annotations

__all__: list[str] = []
