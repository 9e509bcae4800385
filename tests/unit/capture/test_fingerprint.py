"""The gradient fingerprint: identical gradients match, a divergence is seen, and the
rotating share of tensors covers every gradient once per cycle."""

from __future__ import annotations

import math

import torch

from syncscope.capture.fingerprint import SAMPLE, TENSORS, _sample, fingerprint


def _optimizer(shapes: list[tuple[int, ...]], seed: int) -> torch.optim.Optimizer:
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
    return torch.optim.SGD(params, lr=0.1)


SHAPES = [(64,), (64, 256), (3, 5), (4096,), (17, 1031)] * 4  # 20 tensors: cycle of 5


def _same(a: list[float], b: list[float]) -> bool:
    return all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-12) for x, y in zip(a, b, strict=True))


def test_identical_gradients_match_in_every_window() -> None:
    a, b = _optimizer(SHAPES, 0), _optimizer(SHAPES, 0)
    for window in range(6):
        fa, fb = fingerprint(a, window), fingerprint(b, window)
        assert fa is not None and fb is not None
        assert fa.result() == fb.result()
        assert fa.count == len(SHAPES)


def test_one_diverged_gradient_is_seen_once_per_cycle() -> None:
    cycle = -(-len(SHAPES) // TENSORS)
    assert cycle == 5
    for diverged in range(len(SHAPES)):
        a, b = _optimizer(SHAPES, 0), _optimizer(SHAPES, 0)
        grad = b.param_groups[0]["params"][diverged].grad
        grad.view(-1)[0] += 1.0  # element 0 is in every sample (its weight is not 0)
        seen = []
        for window in range(cycle):
            fa, fb = fingerprint(a, window), fingerprint(b, window)
            assert fa is not None and fb is not None
            assert fa.part == (window, cycle)
            if not _same(fa.result(), fb.result()):
                seen.append(window)
        assert seen == [diverged % cycle], diverged


def test_unreduced_gradients_differ_in_every_window() -> None:
    a, b = _optimizer(SHAPES, 0), _optimizer(SHAPES, 1)  # every gradient differs
    for window in range(4):
        fa, fb = fingerprint(a, window), fingerprint(b, window)
        assert fa is not None and fb is not None
        assert not _same(fa.result(), fb.result())


def test_sample_is_the_strided_slice_of_the_flattened_gradient() -> None:
    base = torch.randn(5000)
    for g in (torch.randn(64, 256), torch.randn(7, 1031), base[100:4196].view(64, 64)):
        flat = g.reshape(-1)
        assert torch.equal(_sample(g), flat[:: max(1, flat.numel() // SAMPLE)])
    t = torch.randn(256, 64).t()  # not contiguous
    assert torch.equal(_sample(t), t.reshape(-1)[:: t.numel() // SAMPLE])


def test_half_precision_and_no_gradients() -> None:
    params = [torch.nn.Parameter(torch.zeros(s, dtype=torch.bfloat16)) for s in ((64, 64), (10,))]
    for p in params:
        p.grad = torch.randn(p.shape).to(torch.bfloat16)
    fp = fingerprint(torch.optim.SGD(params, lr=0.1), 0)
    assert fp is not None and all(math.isfinite(v) for v in fp.result())
    empty = torch.optim.SGD([torch.nn.Parameter(torch.zeros(3))], lr=0.1)
    assert fingerprint(empty, 0) is None


def test_value_is_of_the_gradients_when_taken_not_when_read() -> None:
    """On CPU the sum is taken where the value is read (the writer's thread), after the
    optimizer step and the next reset: it must be of the samples copied at the step, also
    when a window's share is a single gradient (whose sample is the gradient itself)."""
    for shapes in (SHAPES, [(64,)]):  # a share of several tensors; a share of one 1-D tensor
        a, b = _optimizer(shapes, 0), _optimizer(shapes, 0)
        for window in range(3):
            expected = fingerprint(b, window)
            taken = fingerprint(a, window)
            assert expected is not None and taken is not None
            value = expected.result()
            saved = [p.grad.clone() for p in a.param_groups[0]["params"]]
            for p in a.param_groups[0]["params"]:
                p.grad.mul_(3.0).add_(1.0)  # the step and the next micro-batches change them
            assert taken.result() == value
            for p, grad in zip(a.param_groups[0]["params"], saved, strict=True):
                p.grad.copy_(grad)


def test_the_planned_path_sums_what_the_general_path_sums() -> None:
    """The common case (CPU float gradients) takes its weights from the plan: the same value
    as the general path's, also once the parameters changed dtype after the plan was made."""
    from syncscope.capture.fingerprint import _plan, _start

    opt = _optimizer(SHAPES, 3)
    for window in range(6):
        fp = fingerprint(opt, window)
        plan = _plan(opt)
        offset = window % plan.cycle
        samples = [_sample(p.grad) for p in opt.param_groups[0]["params"][offset :: plan.cycle]]
        general = _start(torch.cat(samples), False, plan.count, (offset, plan.cycle))
        assert fp is not None and fp.result() == general.result()
        assert (fp.part, fp.count) == (general.part, general.count)
    for p in opt.param_groups[0]["params"]:  # model.double() after the optimizer was made
        p.data = p.data.double()
        p.grad = p.grad.double()
    fp = fingerprint(opt, 0)
    assert fp is not None and all(math.isfinite(v) for v in fp.result())
