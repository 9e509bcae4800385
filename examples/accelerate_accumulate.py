"""Accelerate's ``accumulate()``: one sync per optimizer step, step called every iteration.

Pattern 11 (Accelerate docs). The wrapped optimizer's ``step()``/``zero_grad()`` do nothing
until the last micro-batch, so calling them unconditionally inside ``accumulate`` is right.
"""

import torch
from accelerate import Accelerator
from common import batch, make_model, parse_args, report

args = parse_args()
accelerator = Accelerator(gradient_accumulation_steps=args.accum, cpu=args.device == "cpu")
rank = accelerator.process_index
torch.manual_seed(0)
model = make_model(args)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
model, optimizer = accelerator.prepare(model, optimizer)

for step in range(args.steps):
    for micro in range(args.accum):
        with accelerator.accumulate(model):
            loss = model(batch(args, rank, step, micro)).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    report(args, rank, step, loss.item())
accelerator.end_training()
