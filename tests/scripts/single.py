"""Gradient accumulation in one process, no torch.distributed at all."""

import torch
from torch import nn

model = nn.Linear(8, 8)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _step in range(2):
    for _micro in range(3):
        model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
print("single done")
