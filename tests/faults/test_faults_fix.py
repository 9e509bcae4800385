"""Issue 28, `syncscope fix` on odd and large input: linear time, faithful or refused."""

from __future__ import annotations

import libcst as cst
import pytest

from syncscope.fixes.codemod import FixOptions, fix_source


def _functions(n: int) -> str:
    """``n`` accumulation loops, each in its own function with its own DDP model."""
    head = "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n"
    head += "accum = 4\n"
    loops = [
        f"""
def train{k}(loader):
    model{k} = DDP(torch.nn.Linear(4, 4))
    optimizer{k} = torch.optim.SGD(model{k}.parameters(), lr=0.1)
    for i, batch in enumerate(loader):
        loss = model{k}(batch).sum() / accum
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer{k}.step()
            optimizer{k}.zero_grad()
"""
        for k in range(n)
    ]
    return head + "\n".join(loops)


def _whole_module_walks(monkeypatch: pytest.MonkeyPatch, source: str) -> int:
    """How many times the fix walks the whole module (each walk costs the file's size)."""
    walks = 0
    visit = cst.Module.visit

    def counting(self: cst.Module, visitor: object) -> cst.Module:
        nonlocal walks
        walks += 1
        return visit(self, visitor)  # type: ignore[arg-type]

    monkeypatch.setattr(cst.Module, "visit", counting)
    result = fix_source(source, FixOptions(), path="many.py")
    assert all(p.fixed for p in result.problems) and result.changed
    return walks


def test_fix_walks_the_module_a_fixed_number_of_times_whatever_the_number_of_loops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GIVEN files of 5 and 20 loops WHEN fixed THEN the whole module is walked as often in
    both: no per-loop whole-file work (it made 400 loops 20x the time of 100)."""
    few = _whole_module_walks(monkeypatch, _functions(5))
    many = _whole_module_walks(monkeypatch, _functions(20))
    assert few == many
