"""Lightning automatic optimization under DDP on CPU: ``lightning_accumulate.py ACCUM [log]``.

Lightning runs the micro-batches before the last under DDP ``no_sync`` and the last one's
forward and backward inside ``optimizer.step(closure)``. ``log`` adds
``self.log(..., sync_dist=True)`` with a one-output head, whose 1-element loss all-reduce
has the size of the bias gradient. Run under ``syncscope profile --nproc-per-node 2``.
"""

import os
import sys
import tempfile

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ACCUM = int(sys.argv[1])
LOG = "log" in sys.argv[2:]
STEPS = 2


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        if LOG:
            self.log("train_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    torch.manual_seed(0)
    n = 2 * 4 * ACCUM * STEPS  # 2 ranks, batch 4: exactly STEPS windows per rank
    data = TensorDataset(torch.randn(n, 16), torch.randn(n, 1))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("WORLD_SIZE", "2")),
        strategy="ddp",
        accumulate_grad_batches=ACCUM,
        max_epochs=1,
        limit_train_batches=ACCUM * STEPS,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(prefix="syncscope-lightning-"),
    )
    model = Regressor()
    if trainer.global_rank == 0:  # ground truth for the tests: the gradient bytes of one sync
        print(f"grad_bytes={sum(p.numel() * p.element_size() for p in model.parameters())}")
    trainer.fit(model, DataLoader(data, batch_size=4))


if __name__ == "__main__":
    main()
