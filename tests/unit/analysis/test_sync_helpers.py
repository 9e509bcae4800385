"""A user's own sync helper that did nothing is named.

Hand-built event streams (tests/helpers/events.py): the capture records, on each forward and
backward call site, the ``with`` statements of the user's source around it (``within``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from syncscope.analysis.diagnose import diagnose
from syncscope.capture.sites import enclosing_withs
from syncscope.model import Finding
from tests.helpers.events import Rank, run_of

TRAIN = "/u/train.py"
HELPER = [{"line": 30, "call": "grad_sync_context"}]


def _window(
    r: Rank,
    *,
    wrapper: str = "ddp",
    ops: tuple[str, ...] = ("all_reduce",),
    fwd_within: list[dict[str, Any]] | None = HELPER,
    bwd_within: list[dict[str, Any]] | None = HELPER,
    fwd_site: dict[str, Any] | None = None,
    sync_off: bool = False,
) -> Rank:
    """Four micro-batches that each sync, forward and backward inside ``with`` lines."""
    for _ in range(4):
        site = fwd_site or {"file": TRAIN, "line": 31, "function": "main"}
        fwd: dict[str, Any] = {"site": {**site, **({"within": fwd_within} if fwd_within else {})}}
        if fwd_site is not None and fwd_within:  # around the user's module, recorded apart
            fwd = {"site": site, "within": fwd_within}
        if sync_off:
            r.add("toggle", how="no_sync", value=False, module="ddp:M#0", site=None)
        label = "ddp:M#0" if wrapper == "ddp" else "fsdp:M#0"
        r.add("fwd", wrapper=wrapper, module=label, sync=True, depth=0, **fwd)
        bwd_site: dict[str, Any] = {"file": TRAIN, "line": 32, "function": "main"}
        if bwd_within:
            bwd_site["within"] = bwd_within
        r.add("bwd", sync={label: True}, site=bwd_site)
        for op in ops:
            r.coll(op=op, issuer="fsdp" if wrapper == "fsdp" else "ddp")
        r.add("bwd_end", mem=1000)
        if sync_off:
            r.add("toggle", how="no_sync", value=True, module="ddp:M#0", site=None)
    return r.step()


def _findings(wrappers: tuple[str, ...] = ("ddp",), **kw: Any) -> list[Finding]:
    ranks = [_window(_window(Rank(i, wrappers=wrappers), **kw), **kw).finish() for i in (0, 1)]
    return [f for f in diagnose(run_of(*ranks)) if f.kind == "redundant-sync"]


def test_a_ddp_helper_around_a_non_ddp_module_is_named() -> None:
    # GIVEN `with no_sync(model):` around forward and backward, DDP inside the user's
    # module (its forward site is in Outer.forward; the with is around the caller)
    outer = {"file": TRAIN, "line": 12, "function": "forward"}
    within = [{"file": TRAIN, "line": 30, "call": "no_sync"}]
    (f,) = _findings(
        fwd_site=outer, fwd_within=within, bwd_within=[{"line": 30, "call": "no_sync"}]
    )
    # THEN the finding names the helper (function and line), not "put ... inside no_sync()"
    assert (f.cause, f.severity) == ("sync-helper-no-op", "warning")
    helper = [s for role, s in f.sites if role == "sync_helper"]
    assert [(s.file, s.line, s.function) for s in helper] == [(TRAIN, 30, "no_sync")]
    assert f.evidence["sync_helper"] == f"no_sync() at {TRAIN}:30"
    assert f.fix is not None and f.fix.style == "ddp-no_sync"
    assert f"your helper no_sync() at {TRAIN}:30" in f.fix.summary
    assert "changed no sync state" in f.fix.summary
    assert "Put forward *and* backward inside no_sync()" not in f.fix.summary
    assert "def no_sync(model" in f.fix.snippet and "isinstance(m, DDP)" in f.fix.snippet


def test_a_ddp_only_helper_under_fsdp2_and_hsdp_is_named_in_their_terms() -> None:
    (f,) = _findings(("fsdp",), wrapper="fsdp", ops=("reduce_scatter",))
    assert f.cause == "sync-helper-no-op"  # not fsdp-sharded-accumulation (info)
    assert f.fix is not None and f.fix.style == "fsdp2"
    assert "grad_sync_context() at /u/train.py:30" in f.fix.summary
    # the FSDP modules themselves, wherever they sit (the helper's model may be a wrapper
    # around them that is not an FSDPModule: a setter on it would do nothing)
    assert "module.set_requires_gradient_sync(is_boundary, recurse=False)" in f.fix.snippet
    assert "for module in model.modules()" in f.fix.snippet
    assert "only handles DistributedDataParallel" not in f.fix.summary
    (h,) = _findings(("fsdp",), wrapper="fsdp", ops=("reduce_scatter", "all_reduce"))
    assert h.cause == "sync-helper-no-op"
    assert h.fix is not None and h.fix.style == "hsdp"
    assert "module.set_requires_all_reduce(is_boundary, recurse=False)" in h.fix.snippet


def test_a_with_around_one_of_forward_and_backward_only_is_no_helper() -> None:
    (f,) = _findings(bwd_within=None)
    assert f.cause == "no-no_sync"
    assert not [s for role, s in f.sites if role == "sync_helper"]
    (g,) = _findings(fwd_within=[{"line": 29, "call": "grad_sync_context"}])  # another with
    assert g.cause == "no-no_sync"


def test_a_helper_that_changed_sync_state_is_not_blamed() -> None:
    # it entered no_sync (toggles recorded) and still synced: another cause, not the helper
    findings = _findings(sync_off=True)
    assert all(f.cause != "sync-helper-no-op" for f in findings)


def test_enclosing_withs_reads_the_users_source(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import contextlib, torch\n"  # 1
        "for micro in range(4):\n"  # 2
        "    with torch.autocast('cpu'):\n"  # 3: never a sync helper
        "        with (no_sync(model) if micro < 3 else contextlib.nullcontext()):\n"  # 4
        "            with grad_sync_context(model, micro == 3), open('f'):\n"  # 5
        "                loss = model(x)\n"  # 6
        "                loss.backward()\n"  # 7
        "            y = 1\n"  # 8
        "    step()\n"  # 9
        "with tqdm(total=4) as bar, Timer('train'):\n"  # 10: named like no sync helper
        "    loss.backward()\n"  # 11
    )
    path = str(script)
    expected = [{"line": 4, "call": "no_sync"}, {"line": 5, "call": "grad_sync_context"}]
    assert enclosing_withs(path, 6) == expected
    assert enclosing_withs(path, 7) == expected
    assert enclosing_withs(path, 8) == expected[:1]
    assert enclosing_withs(path, 9) == []
    assert enclosing_withs(path, 11) == []
    assert enclosing_withs(str(tmp_path / "missing.py"), 3) == []
