"""``fix --apply`` never writes over an edit made while it ran: the
rewrite is of the text read at the start; a user's save in between was silently lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from syncscope import cli
from syncscope.fixes import codemod

LOOP = """import torch
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net)
for i, batch in enumerate(loader):
    loss = model(batch).sum()
    loss.backward()
    if (i + 1) % accum == 0:
        optimizer.step()
        optimizer.zero_grad()
"""


def test_an_edit_made_while_fix_runs_is_kept_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text(LOOP)
    edited = LOOP + "# the user's edit, saved while fix ran\n"
    real = codemod.fix_source

    def slow_fix(*args: object, **kwargs: object) -> codemod.FixResult:
        result = real(*args, **kwargs)  # type: ignore[arg-type]
        script.write_text(edited)  # GIVEN the user saves meanwhile
        return result

    monkeypatch.setattr(codemod, "fix_source", slow_fix)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    status = cli.main(["fix", "train.py", "--apply", "--no-backup"])
    err = capsys.readouterr().err
    # THEN the edit is there, untouched, and fix says why it wrote nothing
    assert script.read_text() == edited
    assert status == 2 and "changed while syncscope fix ran; nothing was written" in err
    assert err.count("\n") == 1
