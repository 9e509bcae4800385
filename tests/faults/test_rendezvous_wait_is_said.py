"""A multi-node rendezvous waiting for a node that never comes: ``profile`` says how many
nodes joined and what the rendezvous waits for, while no rank file exists yet."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.faults.test_ranks_outliving_the_script_are_named import LINGER, _ended_rank

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


# --- a multi-node rendezvous waiting for a node that never comes -----------------------------


class _Handler:
    """A c10d rendezvous handler as torch's DynamicRendezvousHandler exposes its state."""

    def __init__(self, joined: int, needed: int = 2, join_s: float = 600.0) -> None:
        from datetime import timedelta
        from types import SimpleNamespace

        self._state_holder = SimpleNamespace(
            state=SimpleNamespace(participants=dict.fromkeys(range(joined), 0))
        )
        self.settings = SimpleNamespace(
            min_nodes=needed, timeout=SimpleNamespace(join=timedelta(seconds=join_s))
        )


C10D = {"nnodes": "2", "rdzv_backend": "c10d", "rdzv_endpoint": "node0:29400"}


def test_rendezvous_watch_says_how_many_nodes_joined(capsys: pytest.CaptureFixture[str]) -> None:
    from syncscope.launch.rendezvous import RendezvousWatch

    watch = RendezvousWatch(C10D)
    watch.handlers.append(_Handler(1))
    watch(2.0)  # too early: ranks may just be starting
    assert capsys.readouterr().err == ""
    watch(5.0)
    watch(30.0)  # the same count within a minute: said once
    assert capsys.readouterr().err == (
        "syncscope: waiting for the rendezvous at node0:29400 (c10d): 1 of 2 node(s) joined "
        "after 5 s; no rank starts until every node has joined (torch gives up after 600 s: "
        "--rdzv-conf join_timeout=SECONDS)\n"
    )
    watch(66.0)  # a minute later: again
    assert "1 of 2 node(s) joined after 66 s" in capsys.readouterr().err
    error = watch.explain("RendezvousTimeoutError")
    assert (
        error == "RendezvousTimeoutError: 1 of 2 node(s) had joined the rendezvous at node0:29400"
    )
    watch.handlers.append(_Handler(2))
    watch(67.0)  # every node is in: the ranks are starting
    assert capsys.readouterr().err == ""
    assert watch.explain("RendezvousClosedError") == "RendezvousClosedError"  # not a wait


def test_rendezvous_watch_without_state(capsys: pytest.CaptureFixture[str]) -> None:
    from syncscope.launch.rendezvous import RendezvousWatch

    RendezvousWatch({"nproc_per_node": "2"})(30.0)  # one node: slow ranks, nothing to say
    assert capsys.readouterr().err == ""
    static = {"nnodes": "2", "master_addr": "10.0.0.1", "master_port": "29500"}
    RendezvousWatch(static)(6.0)
    err = capsys.readouterr().err
    assert err.startswith("syncscope: waiting for the rendezvous at 10.0.0.1:29500 (static): ")
    assert "no rank has started after 6 s; every node of --nnodes 2 must start" in err


def test_monitor_asks_the_rendezvous_watch_while_no_rank_file_exists(tmp_path: Path) -> None:
    from syncscope.launch.torchrun import Monitor

    waited: list[float] = []
    monitor = Monitor(tmp_path, 0.0, poll_s=0.02, on_waiting=waited.append)
    monitor.start()
    time.sleep(0.3)
    _ended_rank(tmp_path, 0)
    time.sleep(0.3)
    monitor.stop()
    monitor.join(timeout=5)
    assert len(waited) >= 3 and waited == sorted(waited)
    assert waited[-1] < 0.5  # not asked once a rank file exists


@pytest.mark.slow
def test_profile_says_what_a_two_node_rendezvous_waits_for(tmp_path: Path) -> None:
    import socket

    script = tmp_path / "linger.py"
    script.write_text(LINGER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "syncscope", "profile", "-q", "--nnodes", "2"]
    command += ["--node-rank", "0", "--rdzv-backend", "c10d"]
    command += ["--rdzv-endpoint", f"localhost:{port}", "--rdzv-conf", "join_timeout=8"]
    start = time.monotonic()
    done = subprocess.run(
        [*command, "--out", str(tmp_path / "run"), str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    took = time.monotonic() - start
    assert f"waiting for the rendezvous at localhost:{port} (c10d): 1 of 2 node(s) joined" in (
        done.stderr
    )
    assert "torch gives up after 8 s" in done.stderr
    assert (
        "the launcher stopped: RendezvousTimeoutError: 1 of 2 node(s) had joined the rendezvous"
        in done.stderr
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert took < 60
