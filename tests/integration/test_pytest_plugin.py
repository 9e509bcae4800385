"""The pytest plugin end to end with ``pytester``: marker passing and failing (with the
assert_syncs text), the fixture, bad marker arguments, and no torch import when unused.

The inner tests build a world-size-1 gloo process group themselves (DDP still all-reduces
there), so they run in this process; one check runs in a subprocess to see a clean
``sys.modules``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest_plugins = ["pytester"]


@pytest.fixture(scope="module", autouse=True)
def _import_torch_before_pytester(tmp_path_factory: pytest.TempPathFactory) -> None:
    """In-process pytester runs drop the modules the inner session imported first; a second
    import of torch's distributed modules then crashes in GC. So run the whole tracked flow
    once out here, importing everything the inner sessions will use."""
    import torch.distributed as dist

    from syncscope.testing.asserts import explain
    from syncscope.testing.track import track
    from tests.helpers.ranks import make_ddp, train

    store = dist.FileStore(str(tmp_path_factory.mktemp("warm") / "store"), 1)  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with track() as stats:
            train(make_ddp(), mode="every", steps=1)
        explain(stats, ["warm-up"])
    finally:
        dist.destroy_process_group()


CONFTEST = textwrap.dedent(
    """
    import contextlib

    import pytest
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP


    @pytest.fixture
    def ddp_model(tmp_path):
        store = dist.FileStore(str(tmp_path / "store"), 1)  # type: ignore[attr-defined]
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        torch.manual_seed(0)
        yield DDP(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1)))
        dist.destroy_process_group()


    def train(model, no_sync, accum=4, steps=2):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(steps):
            for micro in range(accum):
                last = micro == accum - 1
                ctx = model.no_sync() if no_sync and not last else contextlib.nullcontext()
                with ctx:
                    model(torch.randn(4, 8)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    """
)


# Inner sessions run in this process; leave out what makes them slow there: hypothesis's
# plugin (its modules are re-imported and assertion-rewritten on every inner session) and the
# end-of-session gc.collect() passes (torch's heap makes each cost about 0.5 s).
FAST = ("-p", "no:hypothesispytest", "-p", "no:unraisableexception", "-p", "no:cacheprovider")


@pytest.fixture
def inner(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    return pytester


def test_marker_passes_when_the_loop_syncs_once_per_window(inner: pytest.Pytester) -> None:
    inner.makepyfile(
        """
        import pytest
        from conftest import train

        @pytest.mark.syncscope(max_grad_syncs_per_window=1)
        def test_max(ddp_model):
            train(ddp_model, no_sync=True)

        @pytest.mark.syncscope(grad_syncs_per_window=1, at_micro_batch=-1)
        def test_exact(ddp_model):
            train(ddp_model, no_sync=True)

        @pytest.mark.syncscope(grad_syncs_per_window=[4, 4])
        def test_every_micro_batch_on_purpose(ddp_model):
            train(ddp_model, no_sync=False)
        """
    )
    result = inner.runpytest(*FAST)
    result.assert_outcomes(passed=3)


def test_marker_fails_with_the_readable_message(inner: pytest.Pytester) -> None:
    inner.makepyfile(
        """
        import pytest
        from conftest import train

        @pytest.mark.syncscope(max_grad_syncs_per_window=1)
        def test_wasteful(ddp_model):
            train(ddp_model, no_sync=False)
        """
    )
    result = inner.runpytest(*FAST)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*syncscope: gradient syncs are not as expected",
            "*expected at most 1 grad sync(s) per window, saw [[]4, 4[]] "
            "(over the limit: window(s) [[]0, 1[]])",
            "*windows (rank 0, micro-batches counted from 0):",
            "*window 0: 4 micro-batches, 4 grad syncs on micro-batches [[]0, 1, 2, 3[]]; "
            "expected at most 1",
            "*finding: warning redundant-sync (no-no_sync):*",
            "*fix: Put forward and backward inside no_sync()*",
            "*FAILED test_marker_fails_with_the_readable_message.py::test_wasteful*",
        ]
    )
    # the message is the whole report: no traceback into the plugin
    assert "plugin.py" not in result.stdout.str()


def test_marker_does_not_hide_the_tests_own_failure(inner: pytest.Pytester) -> None:
    inner.makepyfile(
        """
        import pytest
        from conftest import train

        @pytest.mark.syncscope(max_grad_syncs_per_window=1)
        def test_broken(ddp_model):
            train(ddp_model, no_sync=False)
            assert 1 == 2, "the test's own assertion"
        """
    )
    result = inner.runpytest(*FAST)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*the test's own assertion*"])
    assert "gradient syncs are not as expected" not in result.stdout.str()


def test_fixture_gives_live_stats(inner: pytest.Pytester) -> None:
    inner.makepyfile(
        """
        from conftest import train
        from syncscope.testing import assert_syncs

        def test_counts(syncscope, ddp_model):
            assert syncscope.grad_syncs_per_window == []
            train(ddp_model, no_sync=True)
            assert syncscope.grad_syncs_per_window == [1, 1]
            assert_syncs(syncscope, per_window=1, at_micro_batch=-1)

        def test_assert_fails(syncscope, ddp_model):
            train(ddp_model, no_sync=False, steps=1)
            assert_syncs(syncscope, per_window=1)
        """
    )
    result = inner.runpytest(*FAST)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*AssertionError: syncscope: gradient syncs are not as expected",
            "*expected grad syncs per window [[]1[]], saw [[]4[]]",
        ]
    )


@pytest.mark.parametrize(
    ("marker", "text"),
    [
        ("max_grad_syncs_per_windw=1", "*takes keyword arguments*; got max_grad_syncs_per_windw"),
        ("1", "*takes keyword arguments*; got 1"),
        ("", "*give at least one limit"),
        ("allow_errors=True", "*give at least one limit"),
        ("max_grad_syncs_per_window='1'", "*max_per_window must be an int, not '1'"),
    ],
)
def test_bad_marker_arguments_fail_that_test_clearly(
    pytester: pytest.Pytester, marker: str, text: str
) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.syncscope({marker})
        def test_marked():
            pass

        def test_unmarked():
            pass
        """
    )
    result = pytester.runpytest(*FAST, "-rN")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([text])
    # AND the message is printed once, with no chained "During handling" traceback
    out = result.stdout.str()
    assert "During handling of the above exception" not in out
    assert out.count("@pytest.mark.syncscope") == 1, out


def test_marker_is_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers", *FAST)
    result.stdout.fnmatch_lines(["@pytest.mark.syncscope(max_grad_syncs_per_window=None, *"])


def test_importing_the_plugin_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import syncscope.testing.plugin, syncscope.testing\n"
        "from syncscope.testing import assert_syncs, spawn\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_a_pytest_session_that_does_not_use_it_never_imports_torch(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import sys

        def test_plain(request):
            assert request.config.pluginmanager.has_plugin("syncscope")
            assert "torch" not in sys.modules
        """
    )
    result = pytester.runpytest_subprocess(*FAST)
    result.assert_outcomes(passed=1)


def test_a_failing_assert_syncs_shows_the_callers_line_not_the_helper(
    inner: pytest.Pytester,
) -> None:
    """The traceback stops at the test's own ``assert_syncs(...)`` line, as
    pytest's own helpers do; the helper's body (its docstring, its checks) is not shown."""
    inner.makepyfile(
        """
        from conftest import train
        from syncscope import track
        from syncscope.testing import assert_syncs

        def test_wasteful(ddp_model):
            with track() as stats:
                train(ddp_model, no_sync=False)
            assert_syncs(stats, per_window=1, at_micro_batch=-1)
        """
    )
    result = inner.runpytest(*FAST)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert ">       assert_syncs(stats, per_window=1, at_micro_batch=-1)" in out
    assert "syncscope: gradient syncs are not as expected" in out
    assert "asserts.py" not in out and "problems = check(" not in out
