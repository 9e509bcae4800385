"""Real 2-rank gloo runs of every example: exact grad syncs per window, ranks agree."""

from __future__ import annotations

import pytest

from tests.conftest import EXAMPLES

pytestmark = pytest.mark.slow  # every test profiles an example on 2 ranks (shared per session)

CASES = [
    # script, grad syncs per window, on micro-batches, collectives per window (op, count)
    ("ddp_sync_every_step.py", 4, [0, 1, 2, 3], ("all_reduce", 4)),
    ("ddp_no_sync_backward_only.py", 4, [0, 1, 2, 3], ("all_reduce", 4)),
    ("ddp_no_sync.py", 1, [3], ("all_reduce", 1)),
    ("accelerate_accumulate.py", 1, [3], ("all_reduce", 1)),
    # FSDP2: two sharded Linear layers, so one reduce-scatter per layer per reduction
    ("fsdp2_no_toggle.py", 4, [0, 1, 2, 3], ("reduce_scatter", 8)),
    ("fsdp2_toggle.py", 1, [3], ("reduce_scatter", 2)),
]


@pytest.mark.parametrize(("script", "syncs", "positions", "collective"), CASES)
def test_example_grad_syncs_per_window(profiled, script, syncs, positions, collective) -> None:  # type: ignore[no-untyped-def]
    run = profiled(EXAMPLES / script, "--steps", "2")
    assert run.proc.returncode == 0, run.proc.stderr[-2000:]
    # a script with no thread of its own: the interpreter's shutdown after the script is not
    # "non-daemon threads still work"
    assert "non-daemon" not in run.proc.stderr, run.proc.stderr[-2000:]
    assert run.report["world_size"] == 2
    assert [r["rank"] for r in run.report["ranks"]] == [0, 1]
    op, count = collective
    for rank in (0, 1):
        windows = run.complete_windows(rank)
        assert len(windows) == 2
        for w in windows:
            assert w["micro_batches"] == 4
            assert w["grad_syncs"] == syncs
            assert w["grad_sync_micro_batches"] == positions
            assert w["collectives"][op] == count
            assert w["grad_sync_bytes"] > 0
    assert run.report["grad_syncs_per_window"] == [syncs, syncs]


@pytest.mark.parametrize(
    "script", ["ddp_sync_every_step.py", "ddp_no_sync.py", "accelerate_accumulate.py"]
)
def test_ddp_fingerprints_agree_across_ranks(profiled, script) -> None:  # type: ignore[no-untyped-def]
    run = profiled(EXAMPLES / script, "--steps", "2")
    for rank in (0, 1):
        assert [w["fingerprint_match"] for w in run.complete_windows(rank)] == [True, True]


def test_fsdp_fingerprints_are_not_compared(profiled) -> None:  # type: ignore[no-untyped-def]
    # FSDP gradients are shards: different on every rank by design, so no verdict.
    run = profiled(EXAMPLES / "fsdp2_toggle.py", "--steps", "2")
    assert all(w["fingerprint_match"] is None for w in run.complete_windows(0))


def test_buffers_and_bucket_rebuild_are_not_grad_syncs(profiled) -> None:  # type: ignore[no-untyped-def]
    run = profiled(EXAMPLES / "ddp_no_sync.py", "--steps", "2")
    w1 = run.complete_windows(0)[1]
    # DDP rebuilds buckets at the second iteration with broadcasts: counted, not grad syncs
    assert w1["collectives"]["broadcast"] >= 1
    assert w1["grad_sync_collectives"] == 1


def test_example_clean_runs_have_clean_verdict(profiled) -> None:  # type: ignore[no-untyped-def]
    for script in ("ddp_no_sync.py", "accelerate_accumulate.py", "fsdp2_toggle.py"):
        report = profiled(EXAMPLES / script, "--steps", "2").report
        assert report["verdict"] == "clean", (script, report["findings"])


def test_run_directory_layout(profiled) -> None:  # type: ignore[no-untyped-def]
    run = profiled(EXAMPLES / "ddp_no_sync.py", "--steps", "2")
    import json

    meta = json.loads((run.run_dir / "meta.json").read_text())
    assert meta["format"] == "syncscope-run" and meta["format_version"] == 1
    assert meta["world_size"] == 2
    assert meta["script"].endswith("ddp_no_sync.py") and len(meta["script_sha256"]) == 64
    files = sorted(p.name for p in (run.run_dir / "ranks").iterdir())
    assert files == ["rank-00000.jsonl", "rank-00001.jsonl"]
    assert run.report["schema_version"] == 1
    assert run.report["command"][0].endswith("ddp_no_sync.py")
