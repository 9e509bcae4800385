"""torch.compile: a profiled model is compiled exactly as the plain one.

One compiled DDP run (aot_eager) and one compiled FSDP2 run (inductor), each launched plainly
under torchrun and under ``syncscope profile`` on 2 gloo ranks; the script dumps Dynamo's
counters per rank. Graph breaks (with their reasons), recompiles and frames must be equal,
nothing on stderr may come from Dynamo about syncscope, and the counts stay exact.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, TEARDOWN_ABORT, ProfiledRun, profile, torchrun

pytestmark = pytest.mark.slow
SCRIPT = ROOT / "tests" / "scripts" / "compiled.py"
CASES = {"ddp": ("ddp", "aot_eager"), "fsdp2": ("fsdp2", "inductor")}


@dataclass
class Pair:
    plain: list[dict[str, Any]]  # counters per rank
    profiled: list[dict[str, Any]]
    run: ProfiledRun


def counters(dump: Path) -> list[dict[str, Any]]:
    return [json.loads((dump / f"counters-{r}.json").read_text()) for r in (0, 1)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Pair]:
    out: dict[str, Pair] = {}
    for name, (wrapper, backend) in CASES.items():
        tmp = tmp_path_factory.mktemp(name)
        args = ("--wrapper", wrapper, "--backend", backend)
        plain = torchrun(SCRIPT, *args, "--dump", str(tmp / "plain"))
        # torch's gloo teardown may abort a plain job after it dumped its counters (the
        # script's last step before destroy_process_group): its counters stand
        dumped = all((tmp / "plain" / f"counters-{r}.json").is_file() for r in (0, 1))
        torn_down = TEARDOWN_ABORT in plain.stderr and dumped
        assert plain.returncode == 0 or torn_down, plain.stderr[-3000:]
        run = profile(tmp, SCRIPT, *args, "--dump", str(tmp / "profiled"))
        assert run.proc.returncode == 0, run.proc.stderr[-3000:]
        out[name] = Pair(counters(tmp / "plain"), counters(tmp / "profiled"), run)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_same_graph_breaks_recompiles_and_frames(runs: dict[str, Pair], name: str) -> None:
    pair = runs[name]
    for plain, profiled in zip(pair.plain, pair.profiled, strict=True):
        assert profiled["graph_break"] == plain["graph_break"]  # same reasons, same counts
        for key in ("graph_breaks", "recompiles", "unique_graphs", "frames_ok", "frames_total"):
            assert profiled[key] == plain[key], key
        assert profiled["frames_total"] > 0  # Dynamo did compile something
        assert profiled["loss"] == plain["loss"]  # and the program computed the same


@pytest.mark.parametrize("name", list(CASES))
def test_dynamo_says_nothing_about_syncscope(runs: dict[str, Pair], name: str) -> None:
    stderr = runs[name].run.proc.stderr
    ours = [ln for ln in stderr.splitlines() if "syncscope" in ln.lower()]
    # only syncscope's own status lines, nothing from Dynamo or Python's warnings
    assert all(ln.startswith("syncscope: ") for ln in ours), ours
    assert "warn" not in stderr.lower(), stderr[-3000:]
    assert "graph break" not in stderr.lower()


@pytest.mark.parametrize(
    ("name", "op", "per_window"), [("ddp", "all_reduce", 1), ("fsdp2", "reduce_scatter", 2)]
)
def test_counts_stay_exact(runs: dict[str, Pair], name: str, op: str, per_window: int) -> None:
    run = runs[name].run
    for rank in (0, 1):
        windows = run.complete_windows(rank)
        assert len(windows) == 2
        for w in windows:
            assert w["micro_batches"] == 4
            assert w["grad_syncs"] == 1  # no_sync / set_requires_gradient_sync proper
            assert w["grad_sync_micro_batches"] == [3]
            assert w["collectives"][op] == per_window
