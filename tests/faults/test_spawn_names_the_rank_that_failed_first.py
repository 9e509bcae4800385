"""``syncscope.testing.spawn`` names the root cause: a rank's own exit code or error comes
before a peer's "Connection reset by peer", whatever arrives first; a rank killed by a
signal is named."""

from __future__ import annotations

import importlib
import os
import sys
import time
from typing import Any

import pytest

# --- spawn: a rank's own exit code before a peer's "Connection reset by peer" ----------------

SPAWN = importlib.import_module("syncscope.testing.spawn")  # the package's name is the function
RESET = "[gloo/transport/tcp/pair.cc:553] Connection reset by peer [127.0.0.1]:2998"


class _Proc:
    """A finished (or running) rank process as _collect sees it."""

    def __init__(self, exitcode: int | None) -> None:
        self.exitcode = exitcode


def _message(rank: int, exc: BaseException) -> tuple[int, str, bytes | None, str]:
    """What a rank sends when ``exc`` ends its function (spawn's own encoding)."""
    data, text = SPAWN._error_payload(exc)
    return rank, "error", data, text


def _collect(procs: list[_Proc], messages: list[Any]) -> BaseException:
    import queue

    results: queue.Queue[Any] = queue.Queue()
    for message in messages:
        results.put(message)
    with pytest.raises(Exception) as info:
        SPAWN._collect(procs, results, {}, 30.0, time.monotonic() + 30.0)
    return info.value


def _notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", []))


def test_spawn_os_exit_9_comes_before_the_peers_connection_reset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(SPAWN, "_GRACE_S", 0.05)
    # rank 0 called os._exit(9) (no message); rank 1 then saw its connection reset
    exc = _collect([_Proc(9), _Proc(1)], [_message(1, RuntimeError(RESET))])
    assert isinstance(exc, RuntimeError)
    assert str(exc).startswith("spawn: rank 0 exited with code 9 without reporting")
    assert "then rank 1 of 2 failed (its connection to a failed rank broke)" in _notes(exc)
    assert "Connection reset by peer" in _notes(exc)


def test_spawn_sys_exit_9_is_named_with_its_code_whatever_arrives_first() -> None:
    exc = _collect(
        [_Proc(1), _Proc(1)], [_message(1, RuntimeError(RESET)), _message(0, SystemExit(9))]
    )
    assert str(exc) == "spawn: rank 0 exited with code 9 (sys.exit(9) in the function)"
    assert "raised on rank 0 of 2" in _notes(exc)
    assert "then rank 1 of 2 failed (its connection" in _notes(exc)


def test_spawn_a_ranks_own_error_stays_the_root_cause() -> None:
    exc = _collect(
        [_Proc(1), _Proc(1), _Proc(1)],
        [
            _message(2, RuntimeError(RESET)),
            _message(1, ValueError("bad batch")),
            _message(0, KeyError("k")),
        ],
    )
    assert isinstance(exc, ValueError) and str(exc) == "bad batch"  # the first own error
    notes = _notes(exc)
    assert notes.index("then rank 0 of 3 failed: KeyError") < notes.index("then rank 2 of 3")


def test_spawn_a_rank_killed_by_a_signal_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SPAWN, "_GRACE_S", 0.05)
    exc = _collect([_Proc(None), _Proc(-9)], [])
    assert str(exc).startswith("spawn: rank 1 was killed by signal SIGKILL without reporting")


def exit_9_on_rank_0(how: str) -> int:
    """Rank 0 exits with code 9 while rank 1 waits for it in an all_reduce."""
    import time

    import torch
    import torch.distributed as dist

    if dist.get_rank() == 0:
        time.sleep(0.5)
        if how == "os._exit":
            os._exit(9)
        sys.exit(9)
    dist.all_reduce(torch.ones(1))
    return 1


@pytest.mark.slow
@pytest.mark.parametrize("how", ["os._exit", "sys.exit"])
def test_spawn_reports_rank_0s_exit_9_not_rank_1s_broken_connection(how: str) -> None:
    import multiprocessing

    from syncscope.testing import spawn

    with pytest.raises(RuntimeError) as info:
        spawn(exit_9_on_rank_0, world_size=2, args=(how,), timeout=60)
    assert str(info.value).startswith("spawn: rank 0 exited with code 9")
    assert "then rank 1 of 2 failed" in _notes(info.value)
    assert not multiprocessing.active_children()
