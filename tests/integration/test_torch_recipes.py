"""torch's own recipes and the loops of its tutorials, profiled by ``syncscope profile`` with
a count made without syncscope beside each (tests/scripts/recipes/, the truth of
tests/helpers/truth.py: wrapped ``torch.distributed`` functions, a pass-through DDP
comm hook per model, parameters compared across replicas after each step).

A recipe that is right must read right: no finding above info, its grad syncs counted as
the truth counts them; a recipe made wrong on purpose is still caught, on the right model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, ProfiledRun, profile

pytestmark = pytest.mark.slow

RECIPES = ROOT / "tests" / "scripts" / "recipes"
WINDOWS = 3

_runs: dict[tuple[str, ...], tuple[ProfiledRun, dict[int, dict[str, Any]]]] = {}


@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """recipe_run(script, *args) -> (profiled run, truth by rank), each made once."""

    def get(script: str, *args: str, nproc: int = 2) -> tuple[ProfiledRun, dict[int, Any]]:
        key = (script, *args)
        if key not in _runs:
            tmp = tmp_path_factory.mktemp(script)
            truth_dir = tmp / "truth"
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("BUG_TRUTH_DIR", str(truth_dir))
                run = profile(
                    tmp, RECIPES / f"{script}.py", "--windows", str(WINDOWS), *args, nproc=nproc
                )
            truth = {
                int(p.stem.removeprefix("truth-rank")): json.loads(p.read_text())
                for p in truth_dir.glob("truth-rank*.json")
            }
            assert sorted(truth) == list(range(nproc)), run.proc.stderr[-3000:]
            _runs[key] = (run, truth)
        return _runs[key]

    return get


def _findings(run: ProfiledRun) -> list[tuple[str, str, str, object]]:
    return [
        (f["kind"], f["cause"], f["severity"], f["evidence"].get("model"))
        for f in run.report["findings"]
    ]


# -- two DDP models stepped in one loop (a GAN) -----------------------------------------------

GAN = {"last": {"D": 1, "G": 1}, "none": {"D": 4, "G": 1}, "forever": {"D": 0, "G": 1}}


def _labels(run: ProfiledRun) -> dict[str, str]:
    """The truth's model names to syncscope's labels: G is wrapped first."""
    wrappers = [w["label"] for w in run.report["ranks"][0]["wrappers"] if w["kind"] == "ddp"]
    assert len(wrappers) == 2, wrappers
    return {"G": wrappers[0], "D": wrappers[1]}


@pytest.mark.parametrize("gate", list(GAN))
def test_gan_grad_syncs_are_counted_per_model(recipe_run, gate: str) -> None:  # type: ignore[no-untyped-def]
    run, truth = recipe_run("gan_two_models", "--d-gate", gate)
    labels = _labels(run)
    for rank, t in truth.items():
        assert t["error"] is None and t["windows_completed"] == WINDOWS
        windows = run.complete_windows(rank)
        assert len(windows) == WINDOWS
        for w, true in zip(windows, t["windows"], strict=True):
            for name, label in labels.items():
                mine = w["models"][label]
                told = true["models"].get(name, {"rounds": 0, "reduced_at": []})
                assert told["rounds"] == GAN[gate][name], (rank, name, true)  # the truth itself
                assert mine["micro_batches"] == 4, (rank, name, w)
                assert mine["grad_syncs"] == told["rounds"], (rank, name, w, true)
                assert mine["grad_sync_micro_batches"] == told["reduced_at"], (rank, name, w)
            assert w["expected_grad_syncs"] == 2


def test_gan_with_right_gates_is_clean(recipe_run) -> None:  # type: ignore[no-untyped-def]
    run, truth = recipe_run("gan_two_models", "--d-gate", "last")
    assert all(w["params_equal"] for t in truth.values() for w in t["windows"])
    assert run.report["verdict"] == "clean", _findings(run)


def test_gan_redundant_sync_names_the_model_that_wastes_it(recipe_run) -> None:  # type: ignore[no-untyped-def]
    run, _ = recipe_run("gan_two_models", "--d-gate", "none")
    labels = _labels(run)
    (finding,) = run.report["findings"]
    assert (finding["kind"], finding["severity"]) == ("redundant-sync", "warning")
    assert finding["evidence"]["model"] == labels["D"]
    assert finding["evidence"]["grad_syncs"] == 4 and finding["evidence"]["micro_batches"] == 4
    assert "gan_two_models.py" in finding["evidence"]["model_wrapped_at"]


def test_gan_model_never_reduced_is_an_error_on_that_model(recipe_run) -> None:  # type: ignore[no-untyped-def]
    run, truth = recipe_run("gan_two_models", "--d-gate", "forever")
    labels = _labels(run)
    assert not any(w["params_equal"] for t in truth.values() for w in t["windows"])
    missing = [f for f in run.report["findings"] if f["kind"] == "missing-sync"]
    assert [f["evidence"]["model"] for f in missing] == [labels["D"]], _findings(run)
    assert [f for f in run.report["findings"] if f["kind"] == "rank-divergence"]
    assert not [f for f in run.report["findings"] if f["kind"] == "redundant-sync"]


def test_gan_sync_helper_passes_fix_check() -> None:
    """stylegan2-ada's ``ddp_sync(module, sync)`` around each phase's forward is the correct
    form (DDP decides at forward): ``fix --check`` finds nothing to fix."""
    from tests.conftest import run_syncscope

    done = run_syncscope("fix", "--check", str(RECIPES / "gan_two_models.py"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "", done.stdout


# -- two FSDP2 roots stepped in one loop (a GAN) ----------------------------------------------

FSDP_GAN = {"last": {"D": 1, "G": 1}, "none": {"D": 4, "G": 1}, "forever": {"D": 0, "G": 1}}


def _fsdp_labels(run: ProfiledRun) -> dict[str, str]:
    """The truth's model names to syncscope's labels: G's forward runs first."""
    roots = [w["label"] for w in run.report["ranks"][0]["wrappers"] if w["kind"] == "fsdp"]
    assert len(roots) == 2, roots
    return {"G": roots[0], "D": roots[1]}


@pytest.mark.parametrize("gate", list(FSDP_GAN))
def test_fsdp_gan_grad_syncs_are_counted_per_root(recipe_run, gate: str) -> None:  # type: ignore[no-untyped-def]
    run, truth = recipe_run("fsdp_gan_two_models", "--d-gate", gate)
    labels = _fsdp_labels(run)
    for rank, t in truth.items():
        assert t["error"] is None and t["windows_completed"] == WINDOWS
        windows = run.complete_windows(rank)
        assert len(windows) == WINDOWS
        for w, true in zip(windows, t["windows"], strict=True):
            sizes = {name: m["bytes"] for name, m in true["models"].items()}
            # the truth's own check: each model's reduce-scatters have one size, its own
            assert all(len(b) == 1 for b in sizes.values()), sizes
            assert len({b[0] for b in sizes.values()}) == len(sizes), sizes
            for name, label in labels.items():
                mine = w["models"][label]
                told = true["models"].get(name, {"rounds": 0, "reduced_at": []})
                assert told["rounds"] == FSDP_GAN[gate][name], (rank, name, true)
                assert mine["micro_batches"] == 4, (rank, name, w)
                assert mine["grad_syncs"] == told["rounds"], (rank, name, w, true)
                assert mine["grad_sync_micro_batches"] == told["reduced_at"], (rank, name, w)
            assert w["expected_grad_syncs"] == 2


def test_fsdp_gan_with_right_gates_is_clean(recipe_run) -> None:  # type: ignore[no-untyped-def]
    run, truth = recipe_run("fsdp_gan_two_models", "--d-gate", "last")
    labels = _fsdp_labels(run)
    assert all(w["params_equal"] for t in truth.values() for w in t["windows"])
    assert run.report["verdict"] == "clean", _findings(run)
    # each model holds unsharded gradients between its micro-batches: a trade-off, per model
    assert sorted(_findings(run), key=str) == sorted(
        [("unsharded-grad-memory", "sync-skipped", "info", labels[m]) for m in ("G", "D")],
        key=str,
    )


def test_fsdp_gan_sharded_accumulation_names_its_model(recipe_run) -> None:  # type: ignore[no-untyped-def]
    run, _ = recipe_run("fsdp_gan_two_models", "--d-gate", "none")
    labels = _fsdp_labels(run)
    sharded = [f for f in run.report["findings"] if f["cause"] == "fsdp-sharded-accumulation"]
    assert [(f["severity"], f["evidence"]["model"]) for f in sharded] == [("info", labels["D"])]
    assert run.report["verdict"] == "clean", _findings(run)


def test_fsdp_gan_root_never_re_enabled_is_an_error_on_that_root(recipe_run) -> None:  # type: ignore[no-untyped-def]
    run, _ = recipe_run("fsdp_gan_two_models", "--d-gate", "forever")
    labels = _fsdp_labels(run)
    missing = [f for f in run.report["findings"] if f["kind"] == "missing-sync"]
    assert [(f["evidence"]["model"], f["severity"]) for f in missing] == [(labels["D"], "error")], (
        _findings(run)
    )
    assert run.report["verdict"] != "clean"


def test_fsdp_gan_gates_pass_fix_check() -> None:
    """Each root's ``set_requires_gradient_sync(last)`` before its own phase's backward is
    the correct FSDP form, also where the G setter sits between D's backward and G's."""
    from tests.conftest import run_syncscope

    done = run_syncscope("fix", "--check", str(RECIPES / "fsdp_gan_two_models.py"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "", done.stdout


# -- GradScaler skipping steps (fp16 overflow) ------------------------------------------------


def test_amp_skipped_steps_are_windows_of_their_own(recipe_run) -> None:  # type: ignore[no-untyped-def]
    run, truth = recipe_run("amp_skipped_step", "--windows", "5")
    for rank, t in truth.items():
        assert t["error"] is None and t["windows_completed"] == 5
        skipped = t["notes"]["skipped"]
        assert 0 < sum(skipped) < 5, skipped  # the truth: some steps skipped, later ones taken
        windows = run.complete_windows(rank)
        assert [w["step_skipped"] for w in windows] == skipped
        for w, true in zip(windows, t["windows"], strict=True):
            assert w["micro_batches"] == 4
            assert w["grad_syncs"] == true["rounds"] == 1
            assert w["grad_sync_micro_batches"] == true["reduced_at_micro_batch"] == [3]
    assert run.report["verdict"] == "clean", _findings(run)
    (finding,) = run.report["findings"]
    assert (finding["kind"], finding["cause"], finding["severity"]) == (
        "skipped-step",
        "grad-scaler-found-inf",
        "info",
    )
    expected = [i for i, s in enumerate(truth[0]["notes"]["skipped"]) if s]
    assert finding["windows"] == expected


# -- FSDP2 + clip_grad_norm_: the norm's DTensor all-reduce ----------------------------------


def test_fsdp2_norm_all_reduce_is_recorded_and_no_grad_sync(recipe_run) -> None:  # type: ignore[no-untyped-def]
    run, truth = recipe_run("fsdp2_clip_grad_norm")
    for rank, t in truth.items():
        assert t["error"] is None and t["windows_completed"] == WINDOWS
        norms = t["notes"]["norm_all_reduces"]
        assert norms == [1] * WINDOWS  # the truth: torch.profiler saw one per window
        windows = run.complete_windows(rank)
        assert [w["collectives"]["all_reduce"] for w in windows] == norms
        for w, true in zip(windows, t["windows"], strict=True):
            # the grad syncs are FSDP's reduce-scatters alone, as the truth counts them
            assert w["grad_syncs"] == true["rounds"] == 4
            assert w["grad_sync_collectives"] == true["reduction_calls"] == 4
            assert w["collectives"]["reduce_scatter"] == 4
    assert {(f["kind"], f["cause"], f["severity"]) for f in run.report["findings"]} == {
        ("redundant-sync", "fsdp-sharded-accumulation", "info")
    }


# -- post-local SGD: replicas that differ across subgroups by design --------------------------


def _grad_rounds(window: dict[str, Any]) -> int:
    """The truth's gradient rounds: reductions inside a backward (the hook's buckets); the
    averager's all-reduce of the parameters, inside the optimizer's step, reduces none."""
    return sum(1 for key in window["round_keys"] if key[1] == "backward")


def test_post_local_sgd_is_info_and_compared_inside_subgroups(recipe_run) -> None:  # type: ignore[no-untyped-def]
    run, truth = recipe_run("post_local_sgd", "--windows", "6", nproc=4)
    world_equal = truth[0]["notes"]["world_equal"]
    # the truth: replicas equal inside each subgroup after every step, across subgroups
    # during the warm-up and right after an averaging only
    assert all(w["params_equal"] for t in truth.values() for w in t["windows"])
    assert world_equal == [True, True, True, False, True, False]
    for rank, t in truth.items():
        windows = run.complete_windows(rank)
        assert [w["grad_syncs"] for w in windows] == [_grad_rounds(w) for w in t["windows"]]
    assert run.report["verdict"] == "clean", _findings(run)
    (finding,) = run.report["findings"]
    assert (finding["kind"], finding["severity"]) == ("local-sgd", "info")
    assert finding["evidence"]["reduction_groups"] == [[0, 1], [2, 3]]
    assert finding["evidence"]["averaging_period"] == 2
    assert finding["windows"] == [2, 3, 4, 5]  # after start_localSGD_iter=2


def test_post_local_sgd_divergence_inside_a_subgroup_is_still_an_error(recipe_run) -> None:  # type: ignore[no-untyped-def]
    run, truth = recipe_run("post_local_sgd", "--windows", "6", "--break-group", nproc=4)
    assert not all(w["params_equal"] for w in truth[1]["windows"])  # rank 1's group differs
    assert all(w["params_equal"] for w in truth[2]["windows"])  # the other group agrees
    kinds = {(f["kind"], f["severity"]) for f in run.report["findings"]}
    assert ("rank-divergence", "error") in kinds, _findings(run)
    assert ("local-sgd", "info") in kinds


# -- torch.profiler's schedule with repeat: one job traced in cycles ----------------------------


@pytest.fixture(scope="module")
def cycle_traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two runs of the cycles recipe (2 ranks, repeat=2, the cycles 2 s apart): ``one/`` holds
    the first run's 4 files, ``two/`` the files of both runs."""
    from tests.conftest import torchrun

    base = tmp_path_factory.mktemp("cycles")
    for name in ("one", "second"):
        out = base / name
        done = torchrun(RECIPES / "profiler_cycles.py", str(out), "--pause", "2", writes=[out])
        assert done.returncode == 0, done.stderr[-3000:]
    (base / "two").mkdir()
    for name in ("one", "second"):
        for f in (base / name).iterdir():
            (base / "two" / f.name).write_bytes(f.read_bytes())
    return base


def _analyze(directory: Path, out: Path) -> tuple[int, str]:
    from tests.conftest import run_syncscope

    done = run_syncscope("analyze", "--quiet", "--out", str(out), str(directory))
    return done.returncode, done.stderr


def test_profiler_cycles_are_one_job_read_cycle_by_cycle(cycle_traces: Path) -> None:
    files = sorted((cycle_traces / "one").iterdir())
    assert len(files) == 4  # the truth: a file per rank per cycle, two pids
    assert len({f.name.split(".")[0] for f in files}) == 2
    code, err = _analyze(cycle_traces / "one", cycle_traces / "out-one")
    assert code == 0, err
    report = json.loads((cycle_traces / "out-one" / "report.json").read_text())
    for rank in report["ranks"]:
        windows = [w for w in rank["windows"] if w["complete"]]
        assert len(windows) == 4, windows  # 2 active steps per cycle, 2 cycles
        assert [w["grad_sync_micro_batches"] for w in windows] == [[3]] * 4
    assert not [f for f in report["findings"] if f["severity"] == "error"]


def test_two_runs_traced_in_cycles_are_still_two_jobs(cycle_traces: Path) -> None:
    code, err = _analyze(cycle_traces / "two", cycle_traces / "out-two")
    assert code == 2, err
    assert "holds traces of 2 jobs" in err


# -- find_unused_parameters=False with a branch some micro-batches skip ------------------------


def test_unused_branch_names_the_unused_parameters_not_the_gate(recipe_run) -> None:  # type: ignore[no-untyped-def]
    run, truth = recipe_run("unused_branch")
    for t in truth.values():  # the truth: window 0 reduced once, window 1 never, then torch stops
        assert "find_unused_parameters" in (t["error"] or "")
        assert [(w["rounds"], w["reduced_at_micro_batch"]) for w in t["windows"]] == [
            (1, [3]),
            (0, []),
        ]
    (missing,) = [f for f in run.report["findings"] if f["kind"] == "missing-sync"]
    assert (missing["cause"], missing["windows"]) == ("unused-parameters", [1])
    snippet = missing["fix"]["snippet"]
    assert "find_unused_parameters=True" in snippet
    assert "no_sync" not in snippet + missing["fix"]["summary"]  # the gate is right
    assert [f["kind"] for f in run.report["findings"] if f["kind"] == "run-failed"]


# -- torch's own algorithms read right today, pinned --------------------------------------------

ALGORITHMS = ("powersgd", "fp16", "zero", "join", "loss")


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_torch_algorithms_read_one_sync_per_window_and_clean(recipe_run, algo: str) -> None:  # type: ignore[no-untyped-def]
    run, truth = recipe_run("torch_algorithms", "--algo", algo)
    for rank, t in truth.items():
        assert t["error"] is None
        windows = run.complete_windows(rank)
        assert len(windows) == t["windows_completed"]  # join: rank 0 ran one window fewer
        for w, true in zip(windows, t["windows"], strict=True):
            # the truth's gradient rounds: reductions inside a backward (Join's flag
            # all-reduces in the forward, the logged loss after the backward reduce none)
            backward = [key for key in true["round_keys"] if key[1] == "backward"]
            assert backward == [[3, "backward"]], (rank, true)
            assert (w["grad_syncs"], w["grad_sync_micro_batches"]) == (1, [3]), (rank, w)
            if true["params_equal"] is not None:
                assert true["params_equal"], (rank, true)
    if algo == "zero":  # its broadcasts after step() are in the windows, never grad syncs
        assert all(w["collectives"]["broadcast"] > 0 for w in run.complete_windows(0)[1:])
    if algo == "loss":
        assert all(w["collectives"]["all_reduce"] >= 2 for w in run.complete_windows(0))
    assert run.report["verdict"] == "clean", _findings(run)
    assert [f for f in run.report["findings"] if f["severity"] != "info"] == []
