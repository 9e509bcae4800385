"""Grad syncs counted per wrapped model (syncscope.model.per_model): a rank that steps two DDP
models in one window (a GAN's D and G) reduces once per model, and each model is judged
against the principle on its own micro-batches, on hand-built event streams."""

from __future__ import annotations

from syncscope.analysis.diagnose import diagnose
from syncscope.model.per_model import grad_syncs_by_model, model_views
from syncscope.render.json_report import window_dict
from tests.helpers.events import Rank, run_of

G, D = "ddp:G#0", "ddp:D#1"


def _gan_rank(rank: int, d_synced_at: tuple[int, ...] = (3,), windows: int = 2) -> Rank:
    """Per micro-batch, D's phase (D's forward, its backward gives D gradients) then G's
    phase (G's and D's forwards, the backward gives G gradients only: D is frozen); D's
    reducer armed on ``d_synced_at``, G's on the last micro-batch."""
    r = Rank(rank, wrappers=("ddp", "ddp"))
    r.events[2]["label"], r.events[3]["label"] = G, D
    for _ in range(windows):
        for micro in range(4):
            d_armed = micro in d_synced_at
            r.add("fwd", wrapper="ddp", module=D, sync=d_armed, depth=0, site=None)
            r.add("bwd", sync={G: False, D: d_armed}, site=None)
            if d_armed:
                r.coll()
            r.add("bwd_end", grads_of=[D])
            last = micro == 3
            r.add("fwd", wrapper="ddp", module=G, sync=last, depth=0, site=None)
            r.add("fwd", wrapper="ddp", module=D, sync=False, depth=0, site=None)
            r.add("bwd", sync={G: last, D: False}, site=None)
            if last:
                r.coll()
            r.add("bwd_end", grads_of=[G])
        r.step()
        r.step()  # the second optimizer closes the same window
    return r.finish()


def test_two_models_each_reduced_once_read_one_per_window_and_clean() -> None:
    run = run_of(_gan_rank(0), _gan_rank(1))
    window = run.ranks[0].windows[0]
    assert (len(window.micro_batches), window.grad_syncs) == (8, 2)
    assert grad_syncs_by_model(run.ranks[0], window) == {
        G: {"micro_batches": 4, "grad_syncs": 1, "grad_sync_micro_batches": [3]},
        D: {"micro_batches": 4, "grad_syncs": 1, "grad_sync_micro_batches": [3]},
    }
    assert window_dict(window, run.ranks[0])["expected_grad_syncs"] == 2
    assert any("step 2 wrapped models" in note for note in run.meta.notes)
    assert diagnose(run) == []


def test_a_model_reducing_every_micro_batch_is_named_alone() -> None:
    run = run_of(*(_gan_rank(r, d_synced_at=(0, 1, 2, 3)) for r in (0, 1)))
    (finding,) = diagnose(run)
    assert (finding.kind, finding.severity) == ("redundant-sync", "warning")
    assert finding.evidence["model"] == D
    assert finding.evidence["grad_syncs"] == 4


def test_a_model_reduced_before_its_last_micro_batch_is_missing_its_sync() -> None:
    run = run_of(*(_gan_rank(r, d_synced_at=(2,)) for r in (0, 1)))
    kinds = {(f.kind, f.evidence.get("model")) for f in diagnose(run)}
    assert ("missing-sync", D) in kinds
    assert all(model != G for _, model in kinds)


def test_one_model_has_one_view_the_window_itself() -> None:
    r = Rank(0).window([3]).finish()
    run = run_of(r)
    window = run.ranks[0].windows[0]
    assert model_views(run.ranks[0], window) == [("", window)]
    assert "models" not in window_dict(window, run.ranks[0])


def test_the_terminal_table_expects_one_sync_per_model() -> None:
    from syncscope.render.terminal import render_text

    run = run_of(_gan_rank(0), _gan_rank(1))
    assert "expected: 1 per model, 2 models, each on its last micro-batch" in render_text(run, [])


# -- FSDP roots (``fully_shard`` or FullyShardedDataParallel), each its own model -------------

FG, FD = "fsdp:G#0", "fsdp:D#1"


def _fsdp_gan_rank(rank: int, d_reduces_at: tuple[int, ...] = (3,), windows: int = 2) -> Rank:
    """Two FSDP roots: per micro-batch D's backward (gives D gradients; D reduce-scatters on
    ``d_reduces_at``), then G's (gives G gradients only; G reduce-scatters on the last). FSDP
    decides at backward: each reduce-scatter names the root whose param group issued it."""
    r = Rank(rank, wrappers=("fsdp", "fsdp"))
    r.events[2]["label"], r.events[3]["label"] = FG, FD
    for _ in range(windows):
        for micro in range(4):
            last = micro == 3
            d_sync = micro in d_reduces_at
            r.add("fwd", wrapper="fsdp", module=FD, sync=d_sync, depth=0, site=None)
            r.add("bwd", sync={FG: False, FD: d_sync}, site=None)
            if d_sync:
                r.coll("reduce_scatter", issuer="fsdp", model=FD)
            r.add("bwd_end", grads_of=[FD])
            r.add("fwd", wrapper="fsdp", module=FG, sync=last, depth=0, site=None)
            r.add("bwd", sync={FG: last, FD: False}, site=None)
            if last:
                r.coll("reduce_scatter", issuer="fsdp", model=FG)
            r.add("bwd_end", grads_of=[FG])
        r.step()
        r.step()
    return r.finish()


def test_two_fsdp_roots_each_reduced_once_read_one_per_model() -> None:
    run = run_of(_fsdp_gan_rank(0), _fsdp_gan_rank(1))
    window = run.ranks[0].windows[0]
    assert (len(window.micro_batches), window.grad_syncs) == (8, 2)
    assert grad_syncs_by_model(run.ranks[0], window) == {
        FG: {"micro_batches": 4, "grad_syncs": 1, "grad_sync_micro_batches": [3]},
        FD: {"micro_batches": 4, "grad_syncs": 1, "grad_sync_micro_batches": [3]},
    }
    assert window_dict(window, run.ranks[0])["expected_grad_syncs"] == 2
    assert all(f.severity == "info" for f in diagnose(run))
    assert not [f for f in diagnose(run) if f.kind in ("redundant-sync", "missing-sync")]


def test_an_fsdp_root_never_reduced_is_missing_its_sync_alone() -> None:
    run = run_of(*(_fsdp_gan_rank(r, d_reduces_at=()) for r in (0, 1)))
    missing = [f for f in diagnose(run) if f.kind == "missing-sync"]
    assert [f.evidence.get("model") for f in missing] == [FD]
