"""Issue 28, launch / attach / test-API faults: each ends in a correct result or a one-line
error, nothing lost, no hang."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from syncscope.testing.spawn import spawn

REPO = Path(__file__).resolve().parents[2]


def _attach(
    tmp_path: Path, env_extra: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(REPO)
    env.update(env_extra)
    return subprocess.run(
        [sys.executable, "-m", "syncscope.attach", *args, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env_extra", "args", "says"),
    [
        ({"RANK": "abc", "WORLD_SIZE": "2"}, (), "RANK='abc'"),
        ({"RANK": "0", "WORLD_SIZE": "two"}, (), "WORLD_SIZE='two'"),
        ({"RANK": "5", "WORLD_SIZE": "2"}, (), "RANK=5 is not below WORLD_SIZE=2"),
        ({}, ("--out", ""), "--out is empty"),
    ],
)
def test_attach_refuses_bad_rank_env_and_empty_out(
    tmp_path: Path, env_extra: dict[str, str], args: tuple[str, ...], says: str
) -> None:
    proc = _attach(tmp_path, env_extra, *args)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], proc.stderr
    assert "ran" not in proc.stdout
    # nothing written next to the script (no run directory in the current directory)
    assert sorted(os.listdir(tmp_path)) == ["train.py"]


def _noop() -> int:
    return 0


@pytest.mark.parametrize(
    ("kwargs", "error", "says"),
    [
        ({"world_size": "2"}, TypeError, "world_size must be an int"),
        ({"world_size": 2.0}, TypeError, "world_size must be an int"),
        ({"timeout": math.nan}, ValueError, "finite positive"),
        ({"timeout": math.inf}, ValueError, "finite positive"),
        ({"timeout": "10"}, TypeError, "timeout must be a number"),
    ],
)
def test_spawn_checks_its_arguments(kwargs: dict[str, object], error: type, says: str) -> None:
    with pytest.raises(error, match=says):
        spawn(_noop, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("rdzv_id", ["../../..", "/etc/x", "a/../../b", "..", "ok-1.2"])
def test_rdzv_id_never_leaves_syncscope_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, rdzv_id: str
) -> None:
    from syncscope.attach import default_out

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", rdzv_id)
    out = default_out("train.py")
    assert out.parent == Path("syncscope-out")
    assert ".." not in out.parts and len(out.parts) == 2
    resolved = (tmp_path / out).resolve()
    assert resolved.is_relative_to((tmp_path / "syncscope-out").resolve())
    if rdzv_id == "ok-1.2":
        assert out.name == "train-ok-1.2"
