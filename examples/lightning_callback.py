"""Lightning with syncscope's callback: the fit fails when a window has too many grad syncs.

    torchrun --standalone --nproc-per-node 2 examples/lightning_callback.py

A tiny regressor on synthetic data, 2 CPU ranks (gloo), ``accumulate_grad_batches=4``, 2
optimizer steps. Lightning syncs once per window (micro-batches before the last under DDP
``no_sync``), so ``max_grad_syncs_per_window=1`` holds and each rank prints
``grad syncs per window [1, 1]``. ``--max-syncs 0`` sets a limit the job cannot meet: the
fit raises AssertionError with ``assert_syncs``'s message on every rank.
"""

import argparse
import tempfile

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from syncscope.integrations.lightning import SyncscopeCallback

ACCUM = 4  # micro-batches per optimizer step
STEPS = 2  # optimizer steps (windows)


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-syncs", type=int, default=1, help="max grad syncs per window")
    args = parser.parse_args()

    torch.manual_seed(0)
    n = 2 * 4 * ACCUM * STEPS  # 2 ranks x batch 4: exactly STEPS whole windows per rank
    data = TensorDataset(torch.randn(n, 16), torch.randn(n, 1))
    sync_check = SyncscopeCallback(max_grad_syncs_per_window=args.max_syncs)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,  # = --nproc-per-node
        strategy="ddp",
        accumulate_grad_batches=ACCUM,
        max_epochs=1,
        limit_train_batches=ACCUM * STEPS,
        callbacks=[sync_check],
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(prefix="lightning-callback-"),
    )
    trainer.fit(Regressor(), DataLoader(data, batch_size=4))

    stats = sync_check.stats  # the same syncscope.Stats as track() gives
    ranks = [r.rank for r in stats.run.ranks]  # gathered from every rank at the end of fit
    print(
        f"rank {stats.rank} of {stats.world_size}: grad syncs per window "
        f"{stats.grad_syncs_per_window}, verdict {stats.verdict}, ranks seen {ranks}"
    )


if __name__ == "__main__":
    main()
