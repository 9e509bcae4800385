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
    assert any("step 2 DDP models" in note for note in run.meta.notes)
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
