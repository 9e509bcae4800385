"""Window accounting from real traces (HTA's GPU traces and syncscope's own gloo traces)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from syncscope.load.traces import load_traces
from syncscope.model import normalize_op

ROOT = Path(__file__).resolve().parents[4]
SAMPLES = ROOT / "sample_traces"
SHARED = ROOT.parent / "shared" / "data" / "kineto"


def _copy(tmp_path: Path, name: str) -> Path:
    dest = tmp_path / name
    shutil.copytree(SAMPLES / name, dest)
    return dest


@pytest.mark.parametrize(
    ("raw", "op"),
    [
        ("c10d::allreduce_", "all_reduce"),
        ("c10d::_allgather_base_", "all_gather"),
        ("c10d::_reduce_scatter_base_", "reduce_scatter"),
        ("c10d::reduce_scatter_tensor_coalesced_", "reduce_scatter"),
        ("c10d::alltoall_base_", "all_to_all"),
        ("c10d::broadcast_", "broadcast"),
        ("nccl:all_reduce", "all_reduce"),
        ("gloo:all_gather", "all_gather"),
        ("c10d::recv_", "recv"),
        ("c10d::barrier", "barrier"),
    ],
)
def test_normalize_op(raw: str, op: str) -> None:
    assert normalize_op(raw) == op


def test_nccl_ddp_trace(tmp_path: Path) -> None:
    # GIVEN a real DDP trace whose Optimizer.step annotation appears twice per step
    run = load_traces([_copy(tmp_path, "nccl_parser_config")])
    (rank,) = run.ranks
    # THEN one window per step, each with 5 grad all-reduces (1 round) and 2 buffer broadcasts
    assert run.meta.source == "trace" and run.world_size == 2 and rank.rank == 0
    assert len(rank.windows) == 3
    for w in rank.windows:
        assert w.complete and w.steps == 1
        assert w.op_counts()["all_reduce"] == 5 and w.op_counts()["broadcast"] == 2
        assert len(w.grad_sync_collectives) == 5 and w.grad_syncs == 1
        assert all(
            c.phase == "forward" and not c.grad_sync for c in w.collectives if c.op == "broadcast"
        )
        assert all(c.bytes > 0 and c.group_ranks == (0, 1) for c in w.collectives)
        assert all(c.done_ns is not None and c.done_ns >= c.start_ns for c in w.collectives)
        assert w.comm_ns and w.exposed_comm_ns is not None and w.exposed_comm_ns <= w.comm_ns
    # AND the report says plainly that rank 1 was not seen
    assert any("rank(s) 1 were not seen" in n for n in run.meta.notes)


def test_nested_optimizers_close_one_window(tmp_path: Path) -> None:
    run = load_traces([_copy(tmp_path, "trace_filter")])
    assert [r.rank for r in run.ranks] == [0, 1] and run.world_size == 128
    for rank in run.ranks:
        assert [w.steps for w in rank.windows] == [2, 2]  # Shampoo inside EMA, merged
        for w in rank.windows:
            assert w.op_counts()["all_reduce"] == 2 and w.grad_syncs == 1
            assert not any(c.grad_sync for c in w.collectives if c.op != "all_reduce")


@pytest.mark.parametrize(
    ("name", "rounds", "positions", "ops"),
    [
        ("syncscope-gloo-ddp-every", 4, [0, 1, 2, 3], {"all_reduce": 8}),
        ("syncscope-gloo-ddp-no_sync", 1, [3], {"all_reduce": 2}),
        ("syncscope-gloo-fsdp2", 4, [0, 1, 2, 3], {"reduce_scatter": 16, "all_gather": 32}),
    ],
)
def test_own_gloo_traces(
    tmp_path: Path, name: str, rounds: int, positions: list[int], ops: dict[str, int]
) -> None:
    run = load_traces([_copy(tmp_path, name)])
    assert [r.rank for r in run.ranks] == [0, 1]
    for rank in run.ranks:
        assert rank.device == "cpu" and rank.backend == "gloo"
        assert [w.index for w in rank.windows] == [1, 2]  # syncscope.window#N names them
        for w in rank.windows:
            assert len(w.micro_batches) == 4
            assert w.grad_syncs == rounds and w.grad_sync_micro_batches == positions
            assert all(w.op_counts()[op] == n for op, n in ops.items())
            assert w.comm_ns is not None and w.compute_ns is not None


@pytest.mark.skipif(
    not (SHARED / "df_index_resolver").is_dir(),
    reason=f"needs HTA's df_index_resolver trace (3 MB) at {SHARED}, beside the checkout",
)
def test_unbucketed_trace_without_markers(tmp_path: Path) -> None:
    dest = tmp_path / "df"
    shutil.copytree(SHARED / "df_index_resolver", dest)
    run = load_traces([dest])
    (rank,) = run.ranks
    assert rank.rank == 1 and len(rank.windows) == 5
    for w in rank.windows:
        assert len(w.grad_sync_collectives) == 404 and w.grad_syncs == 1
        assert {c.micro_batch for c in w.collectives} == {0}
    assert any("no micro-batch markers" in n for n in run.meta.notes)
    assert any("no recorded size" in n for n in run.meta.notes)
