"""`syncscope fix` on odd and large input: linear time, faithful or refused."""

from __future__ import annotations

from pathlib import Path

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


# --- one file at a time, as users run it (in process through main()) ------------------------

HEAD = (
    "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n"
    "model = DDP(torch.nn.Linear(4, 4))\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\naccum = 4\n"
)
EVERY_MICRO_BATCH = HEAD + (
    "for i, batch in enumerate(loader):\n"
    "    loss = model(batch).sum() / accum\n"
    "    loss.backward()\n"
    "    if (i + 1) % accum == 0:\n"
    "        optimizer.step()\n"
    "        optimizer.zero_grad()\n"
)


def _fix(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], cwd: Path, *args: str
) -> tuple[int, str, str]:
    from syncscope import cli

    monkeypatch.chdir(cwd)
    capsys.readouterr()
    status = cli.main(["fix", *args])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_a_walrus_in_the_removed_test_is_refused_not_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The forward computed in the ``if`` test: rewriting the branches away would delete it
    (NameError at run time); the loop is reported, not rewritten, and the file is intact."""
    script = tmp_path / "walrus.py"
    source = HEAD + (
        "for micro, x in enumerate(loader):\n"
        "    if (loss := model(x).sum() / accum) is not None and micro < accum - 1:\n"
        "        with model.no_sync():\n"
        "            loss.backward()\n"
        "    else:\n"
        "        loss.backward()\n"
        "    if micro == accum - 1:\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad()\n"
    )
    script.write_text(source)
    status, _out, err = _fix(monkeypatch, capsys, tmp_path, "--apply", "walrus.py")
    assert status == 1
    assert "(fixed)" not in err and "wrote" not in err
    assert "would drop `(loss := model(x).sum() / accum)`" in err
    assert script.read_text() == source


@pytest.mark.parametrize(
    ("encoding", "prefix"),
    [("latin-1", b"# -*- coding: latin-1 -*-\n# caf\xe9\n"), ("utf-8-sig", b"\xef\xbb\xbf")],
)
def test_a_script_python_runs_is_read_and_written_in_its_own_encoding(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    encoding: str,
    prefix: bytes,
) -> None:
    """A PEP 263 latin-1 file and a UTF-8 file with a byte-order mark are fixed, and written
    back in the same encoding (the mark kept)."""
    script = tmp_path / "enc.py"
    script.write_bytes(prefix + EVERY_MICRO_BATCH.encode())
    compile(script.read_bytes(), str(script), "exec")  # Python runs it
    status, _, err = _fix(monkeypatch, capsys, tmp_path, "--apply", "--no-backup", "enc.py")
    assert status == 0, err
    data = script.read_bytes()
    assert data.startswith(prefix)
    text = data.decode(encoding)
    assert "no_sync()" in text
    compile(data, str(script), "exec")


def test_a_match_statement_that_already_suppresses_sync_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``match``/``case`` with forward and backward under no_sync() in the non-last case
    is correct: no redundant nested no_sync() is added around it."""
    script = tmp_path / "match.py"
    script.write_text(
        HEAD + "for i, batch in enumerate(loader):\n"
        "    match i % accum:\n"
        "        case 3:\n"
        "            loss = model(batch).sum()\n"
        "            loss.backward()\n"
        "        case _:\n"
        "            with model.no_sync():\n"
        "                loss = model(batch).sum()\n"
        "                loss.backward()\n"
        "    if i % accum == 3:\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad()\n"
    )
    status, out, err = _fix(monkeypatch, capsys, tmp_path, "match.py")
    assert (status, out, err) == (0, "", "")


def test_a_directory_is_named_as_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "pkg").mkdir()
    status, _, err = _fix(monkeypatch, capsys, tmp_path, "pkg")
    assert status == 2
    assert err.strip().splitlines() == [err.strip()] and "is a directory" in err


def test_a_script_that_cannot_be_written_is_refused_before_anything_claims_success(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A write that fails (a read-only file or file system; root writes read-only files, so
    the failure is made here): one line, exit 2, no "(fixed)" printed, the file intact."""
    import errno

    from syncscope import atomic

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(atomic, "atomic_write", refuse)
    script = tmp_path / "ro.py"
    script.write_text(EVERY_MICRO_BATCH)
    status, _, err = _fix(monkeypatch, capsys, tmp_path, "--apply", "--no-backup", "ro.py")
    assert status == 2
    assert "(fixed)" not in err and "wrote" not in err
    assert "cannot write it (Read-only file system)" in err
    assert script.read_text() == EVERY_MICRO_BATCH
