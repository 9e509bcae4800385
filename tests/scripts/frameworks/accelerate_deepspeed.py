"""Accelerate driving DeepSpeed (``DeepSpeedPlugin(zero_stage=STAGE, gradient_accumulation_steps=4)``)
on CPU: ``accelerate_deepspeed.py STAGE``, a tiny MLP, ``with accelerator.accumulate(model)``
around forward, ``accelerator.backward`` and an unconditional ``optimizer.step()``. Prints the
gradient bytes of the model (``grad_bytes=``) as the ground truth of one reduction. Run under
``syncscope profile --nproc-per-node 2``.
"""

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("ACCELERATE_USE_DEEPSPEED", "true")  # what `accelerate launch` would set

import torch
from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin

GAS = 4
WINDOWS = 3


def main() -> None:
    stage = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    world = int(os.environ.get("WORLD_SIZE", "1"))
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "train_batch_size": 4 * GAS * world,
        "gradient_accumulation_steps": GAS,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
    }
    plugin = DeepSpeedPlugin(hf_ds_config=config)
    accelerator = Accelerator(deepspeed_plugin=plugin)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(4 * 2 * GAS * WINDOWS, 16))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    print(f"grad_bytes={sum(p.numel() * p.element_size() for p in model.parameters())}")
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    # the rank as torch.distributed has it (Accelerate's process_index read 0 on both CPU
    # ranks here, and its loader was not sharded: each rank runs every batch)
    print(f"rank{torch.distributed.get_rank()}_batches={len(loader)}")
    for (x,) in loader:
        with accelerator.accumulate(model):
            loss = model(x).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()


if __name__ == "__main__":
    main()
