"""``capture.hooks.opaque``: hook bodies kept out of Dynamo's reach, with no wrapper in eager mode."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._C._dynamo.eval_frame import get_eval_frame_callback
from torch._dynamo.utils import counters

from syncscope.capture.hooks import opaque as opaque_module
from syncscope.capture.hooks.opaque import opaque


def _compiled_run(
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]], backward: bool
) -> tuple[int, int, list[Any]]:
    """Graph breaks and graphs of a compiled function that calls a wrapped hook twice (and
    ``backward``), with the Dynamo callback each hook call saw."""
    torch._dynamo.reset()
    counters.clear()
    seen: list[Any] = []

    def body(value: Any) -> None:
        seen.append(get_eval_frame_callback())

    hook = wrap(body)
    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 4)

    def step(x: torch.Tensor) -> torch.Tensor:
        y = linear(x).relu()
        hook(y)
        z: torch.Tensor = (y * 3).sum()
        hook(z)
        if backward:
            z.backward()
        return z

    compiled = torch.compile(step, backend="eager")
    for _ in range(3):
        compiled(torch.ones(2, 4))
    return sum(counters["graph_break"].values()), counters["stats"]["unique_graphs"], seen


@pytest.mark.parametrize("backward", [False, True])
def test_compiled_callers_break_where_they_break_at_the_supported_wrapper(backward: bool) -> None:
    supported = _compiled_run(torch.compiler.disable, backward)
    ours = _compiled_run(opaque, backward)
    assert ours[:2] == supported[:2]
    assert supported[0] >= 2  # the hooks are graph breaks: the comparison means something
    # every call ran eagerly, outside Dynamo (no callback set for the body or its callees)
    assert len(ours[2]) == len(supported[2]) == 6
    assert set(ours[2]) == {None}


def test_eager_calls_skip_the_disable_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def counting_disable(fn: Callable[..., Any]) -> Callable[..., Any]:
        def disabled(*args: Any, **kwargs: Any) -> Any:
            calls.append("disabled")
            return fn(*args, **kwargs)

        return disabled

    monkeypatch.setattr(torch.compiler, "disable", counting_disable)
    callers: list[str] = []

    def body(x: int, *, y: int) -> int:
        callers.append(sys._getframe(1).f_code.co_name)
        return x + y

    hook = opaque(body)
    assert hook(1, y=2) == 3
    if opaque_module.torch_release() < opaque_module._CALLBACK_SAFE_FROM:
        # torch 2.6 and 2.7: always the supported wrapper (the check would free Dynamo's callback)
        assert calls == ["disabled"] and callers == ["disabled"]
        return
    assert calls == [] and callers == ["hook"]
    assert hook.__name__ == "body" and hook.__wrapped__ is body  # type: ignore[attr-defined]


def test_without_the_callback_check_the_supported_wrapper_is_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(opaque_module, "_callback_getter", lambda: None)

    def body() -> int:
        return 1

    hook = opaque(body)
    assert hook() == 1
    assert hook is not body and getattr(hook, "_torchdynamo_disable", False)


@pytest.mark.parametrize(
    ("release", "checked"),
    [("2.6.0+cu124", False), ("2.7.1+cu126", False), ("2.8.0", True), ("2.15.0+cu132", True)],
)
def test_the_callback_check_is_left_out_where_it_frees_dynamos_callback(
    monkeypatch: pytest.MonkeyPatch, release: str, checked: bool
) -> None:
    # GIVEN: torch 2.6 or 2.7, whose get_eval_frame_callback gives away a reference of the
    # callback at each call (a compiled job reaching a hook then crashes), or a later release
    monkeypatch.setattr(torch, "__version__", release)

    def body() -> int:
        return 1

    # WHEN: a hook is made opaque
    hook = opaque(body)
    # THEN: before 2.8 it is torch's supported wrapper (no check called), from 2.8 the checked hook
    assert hook() == 1
    assert getattr(hook, "_torchdynamo_disable", False) is not checked


@pytest.mark.parametrize("release", ["2.7.1+cu126", torch.__version__])
def test_a_hook_over_a_disabled_hook_runs_itself(
    monkeypatch: pytest.MonkeyPatch, release: str
) -> None:
    # GIVEN: a hook that functools.wraps an earlier session's disabled hook (overlapping
    # track() blocks), which copies its _torchdynamo_orig_callable
    monkeypatch.setattr(torch, "__version__", release)
    calls: list[str] = []

    def lower() -> None:
        calls.append("lower")

    below = torch.compiler.disable(lower)

    @functools.wraps(below)
    def upper() -> None:
        calls.append("upper")
        below()

    # WHEN: it is made opaque and called, eagerly and as Dynamo would (the disabled wrapper)
    hook = opaque(upper)
    hook()
    # THEN: it runs itself, then the hook beneath, not the one beneath alone
    assert calls == ["upper", "lower"]
