"""``syncscope.integrations``: the framework callbacks in real training runs.

- The docs' examples (examples/lightning_callback.py, examples/hf_trainer_callback.py) under
  plain ``torchrun`` on 2 gloo ranks: the callback counts one grad sync per window on every
  rank, with every rank's events gathered at the end, and a job over the limit fails with
  ``assert_syncs``'s message.
- The ``pytorch_lightning`` variant in this process (DDP of world size 1, which still
  all-reduces): counts, a limit that fails ``fit()``, and an exception inside ``fit()``.
- ``import syncscope, syncscope.integrations`` imports no framework.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from syncscope.capture.hooks import collectives
from tests.conftest import EXAMPLES, ROOT, torchrun

LIGHTNING = EXAMPLES / "lightning_callback.py"
HF_TRAINER = EXAMPLES / "hf_trainer_callback.py"
NOT_AS_EXPECTED = "AssertionError: syncscope: gradient syncs are not as expected"


def rank_lines(proc: subprocess.CompletedProcess[str]) -> dict[int, str]:
    """What each rank printed after training: ``rank R of 2: grad syncs per window ...``
    (the ranks share stdout: a line may run into the other rank's)."""
    found = re.findall(
        r"rank (\d) of (\d+): (grad syncs per window \[[\d, ]*\], verdict \w+, "
        r"ranks seen \[[\d, ]*\])",
        proc.stdout,
    )
    return {int(rank): f"world {world}: {rest}" for rank, world, rest in found}


PASSED = "world 2: grad syncs per window [1, 1], verdict clean, ranks seen [0, 1]"


@pytest.mark.slow
def test_lightning_callback_counts_one_sync_per_window_on_two_ranks() -> None:
    # GIVEN Lightning, accumulate_grad_batches=4, max_grad_syncs_per_window=1, torchrun x 2
    proc = torchrun(LIGHTNING)
    # THEN fit() passes and each rank's stats show 1 sync per window, every rank gathered
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert rank_lines(proc) == {0: PASSED, 1: PASSED}, proc.stdout[-2000:]


@pytest.mark.slow
def test_lightning_callback_fails_the_fit_readably_over_the_limit() -> None:
    # GIVEN the same job with a limit it cannot meet: at most 0 syncs per window
    proc = torchrun(LIGHTNING, "--max-syncs", "0")
    # THEN fit() raises on the ranks with assert_syncs's message, and nothing is printed after
    assert proc.returncode != 0
    assert rank_lines(proc) == {}
    err = proc.stderr
    assert NOT_AS_EXPECTED in err, err[-3000:]
    assert (
        "expected at most 0 grad sync(s) per window, saw [1, 1] (over the limit: window(s) [0, 1])"
        in err
    )
    assert "window 0: 4 micro-batches, 1 grad sync on micro-batches [3]; expected at most 0" in err


@pytest.mark.slow
def test_hf_trainer_callback_counts_one_sync_per_window_on_two_ranks() -> None:
    # GIVEN the HF Trainer, gradient_accumulation_steps=4, max_grad_syncs_per_window=1
    proc = torchrun(HF_TRAINER)
    # THEN train() passes and each rank's stats show 1 sync per window, every rank gathered
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert rank_lines(proc) == {0: PASSED, 1: PASSED}, proc.stdout[-2000:]


@pytest.mark.slow
def test_hf_trainer_callback_fails_train_readably_when_every_micro_batch_syncs() -> None:
    # GIVEN sync_each_batch=True: a grad sync on each of the 4 micro-batches of a window
    proc = torchrun(HF_TRAINER, "--sync-each-batch")
    # THEN train() raises with the windows, where the syncs landed and the Trainer's fix
    assert proc.returncode != 0
    assert rank_lines(proc) == {}
    err = proc.stderr
    assert NOT_AS_EXPECTED in err, err[-3000:]
    assert "expected at most 1 grad sync(s) per window, saw [4, 4]" in err
    assert (
        "window 1: 4 micro-batches, 4 grad syncs on micro-batches [0, 1, 2, 3]; expected at most 1"
        in err
    )
    assert "finding: info redundant-sync (sync-each-batch)" in err
    assert '"sync_each_batch": False' in err  # the fix, in the Trainer's accelerator_config


def test_importing_syncscope_and_its_integrations_imports_no_framework() -> None:
    code = (
        "import sys, syncscope, syncscope.integrations\n"
        "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'transformers', 'torch')"
        " if m in sys.modules))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


# -- pytorch_lightning in this process --------------------------------------------------------


def pl_fit(callback: Any, tmp_path: Path, fail_at_batch: int | None = None) -> None:
    """2 windows of 2 micro-batches under DDP (world size 1) with ``pytorch_lightning``;
    ``fail_at_batch``: training_step raises RuntimeError there."""
    import pytorch_lightning as pl

    class Regressor(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(8, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if batch_idx == fail_at_batch:
                raise RuntimeError(f"bad batch {batch_idx}")
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16, 8), torch.randn(16, 1))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy="ddp",
        accumulate_grad_batches=2,
        max_epochs=1,
        limit_train_batches=4,
        callbacks=[callback],
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(Regressor(), DataLoader(data, batch_size=4))


@pytest.mark.usefixtures("process_group")
def test_pytorch_lightning_callback_counts_fails_over_the_limit_and_survives_exceptions(
    tmp_path: Path,
) -> None:
    from syncscope.integrations.pytorch_lightning import SyncscopeCallback

    # GIVEN the standalone pytorch_lightning package, accumulate_grad_batches=2
    ok = SyncscopeCallback(max_grad_syncs_per_window=1, at_micro_batch=-1)
    pl_fit(ok, tmp_path)
    # THEN one sync per window on the last micro-batch, and the limits held
    assert ok.stats.grad_syncs_per_window == [1, 1]
    assert [w["grad_sync_micro_batches"] for w in ok.stats.windows if w["complete"]] == [[1], [1]]
    assert (ok.stats.verdict, ok.tracking) == ("clean", False)

    # GIVEN an exact count the job does not have
    strict = SyncscopeCallback(grad_syncs_per_window=2)
    with pytest.raises(AssertionError) as info:
        pl_fit(strict, tmp_path)
    # THEN fit() raises assert_syncs's message
    message = str(info.value)
    assert message.startswith("syncscope: gradient syncs are not as expected\n")
    assert "expected grad syncs per window [2, 2], saw [1, 1]" in message
    assert "window 0: 2 micro-batches, 1 grad sync on micro-batches [1]; expected 2" in message

    # GIVEN training_step raising in the second window
    crashed = SyncscopeCallback(max_grad_syncs_per_window=1)
    with pytest.raises(RuntimeError, match="bad batch 3"):
        pl_fit(crashed, tmp_path, fail_at_batch=3)
    # THEN on_exception ended the tracking: failed, hooks gone, what ran is kept
    assert crashed.stats.verdict == "failed"
    assert crashed.stats.run.ranks[0].exit_reason == "exception"
    assert crashed.stats.grad_syncs_per_window == [1]
    assert not crashed.tracking
    assert collectives._library is None  # no recorder left: the c10d kernels are unregistered


@pytest.mark.parametrize("example", [LIGHTNING, HF_TRAINER], ids=["lightning", "hf_trainer"])
def test_the_docs_show_the_tested_examples_verbatim(example: Path) -> None:
    docs = (ROOT / "docs" / "testing-api.md").read_text()
    assert example.read_text().rstrip("\n") in docs
