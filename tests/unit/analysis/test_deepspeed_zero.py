"""DeepSpeed's engine in DeepSpeed's words, on hand-built runs shaped as capture records a
DeepSpeed job (a ``deepspeed`` wrapper with its ZeRO stage and accumulation steps, the
reductions DeepSpeed issues inside ``engine.backward`` as issuer ``deepspeed``)."""

from __future__ import annotations

from syncscope.analysis.diagnose import diagnose
from syncscope.load.captured import is_grad_sync
from syncscope.model import Finding, Run
from tests.helpers.events import Rank, run_of

LABEL = "deepspeed:M#0"


def engine_rank(rank: int, stage: int, gas: int = 4) -> Rank:
    r = Rank(rank, wrappers=())
    r.add(
        "wrapper",
        kind="deepspeed",
        label=LABEL,
        params=4,
        param_bytes=4096,
        shard_world=2,
        zero_stage=stage,
        accumulation_steps=gas,
    )
    r.add("framework", name="deepspeed", version="0.19.8", zero_stage=stage)
    return r


def micro_batch(r: Rank, ours: bool, manual: int = 0) -> None:
    r.add("fwd", wrapper="deepspeed", module=LABEL, sync=ours, depth=0, site=None)
    r.add("bwd", sync={LABEL: ours}, site={"file": "/u/train.py", "line": 11})
    if ours:
        r.coll(issuer="deepspeed")
    r.add("bwd_end", mem=1000)
    for _ in range(manual):  # the user's all_reduce of .grad after engine.backward
        r.coll(issuer="user", phase="after-backward", grad_storage=True, grad_content=False)


def job(
    stage: int, positions: list[int], n: int = 4, gas: int = 4, manual: tuple[int, ...] = ()
) -> Run:
    ranks = []
    for rank in (0, 1):
        r = engine_rank(rank, stage, gas)
        for _ in range(2):
            for i in range(n):
                micro_batch(r, i in positions, manual=1 if i in manual else 0)
            r.coll(op="all_gather", phase="optimizer", issuer="deepspeed")  # post-step gather
            r.step()
        ranks.append(r.finish())
    return run_of(*ranks)


def only(found: list[Finding], kind: str) -> Finding:
    (f,) = [f for f in found if f.kind == kind]
    return f


def test_a_deepspeed_reduction_in_backward_is_a_grad_sync_its_gathers_are_not() -> None:
    ev = {"op": "all_reduce", "issuer": "deepspeed", "phase": "backward", "dtype": "float32"}
    assert is_grad_sync(ev)
    assert not is_grad_sync({**ev, "phase": "optimizer"})  # the gradient-norm all-reduce
    assert not is_grad_sync({**ev, "op": "all_gather"})


def test_zero_1_reducing_at_the_boundary_is_clean_and_recorded() -> None:
    run = job(1, [3])
    assert diagnose(run) == []
    assert {(r.framework, r.zero_stage) for r in run.ranks} == {("deepspeed", 1)}
    assert all(w.grad_syncs == 1 for r in run.ranks for w in r.windows)


def test_zero_2_every_micro_batch_is_an_info_trade_off_with_the_stage_1_alternative() -> None:
    f = only(diagnose(job(2, [0, 1, 2, 3])), "redundant-sync")
    assert (f.cause, f.severity) == ("zero-partitioned-gradients", "info")
    assert f.cost["extra_memory_bytes_if_stage_1"] == 2048  # 4096 x (1 - 1/2)
    assert f.cost["wasted_bytes_per_window"] == 3 * 4096
    assert f.fix is not None and f.fix.style == "deepspeed-zero-stage"
    assert '"stage": 1' in f.fix.summary
    assert "no_sync" not in f.fix.snippet


def test_a_manual_all_reduce_every_micro_batch_is_named_without_no_sync() -> None:
    found = diagnose(job(1, [3], manual=(0, 1, 2)))
    f = only(found, "redundant-sync")
    assert (f.cause, f.severity) == ("deepspeed-manual-all-reduce", "warning")
    assert f.fix is not None and f.fix.style == "deepspeed-manual-all-reduce"
    assert "no_sync()" not in f.fix.snippet


def test_a_manual_all_reduce_on_deepspeeds_micro_batch_is_reduced_twice() -> None:
    found = diagnose(job(0, [3], manual=(3,)))
    f = only(found, "redundant-sync")
    assert (f.cause, f.severity) == ("deepspeed-reduced-twice", "warning")
    assert f.cost["wasted_bytes_per_window"] == 4096
    assert f.evidence["micro_batch"] == 3


def test_a_step_every_two_micro_batches_doubles_the_window_and_is_named() -> None:
    found = diagnose(job(0, [6, 7], n=8))
    irregular = only(found, "irregular-window")
    assert irregular.cause == "deepspeed-step-every-n"
    assert irregular.evidence["micro_batches_per_engine_step"] == 2
    assert irregular.fix is not None and irregular.fix.style == "deepspeed-step"
    assert only(found, "redundant-sync").cause == "deepspeed-step-every-n"


def test_zero_2_with_gas_1_and_hand_accumulation_loses_gradients() -> None:
    found = diagnose(job(2, [0, 1, 2, 3], gas=1))
    f = only(found, "grad-reset-mid-window")
    assert (f.cause, f.severity) == ("deepspeed-boundary-every-micro-batch", "error")
    assert f.cost["lost_share_of_gradient"] == 0.75
    assert f.fix is not None and f.fix.style == "deepspeed-gas"
