"""``fix --verify``'s verdict on speed: the measured speed-up, with its own noise range,
against the speed-up the original's report projected (``figures.judge``)."""

from __future__ import annotations

from typing import Any

from syncscope.fixes.verify import Profiled, Projected, Verification, _summarize, render
from syncscope.model.figures import Stat

PROJECTED = Stat(1.42, 1.35, 2.40, 10)  # as the README-sized example's report projected it


def _profiled(windows_ms: list[float], projected: Projected | None = None) -> Profiled:
    return Profiled(
        (1,) * len(windows_ms),
        None,
        None,
        frozenset(),
        windows_ns=tuple(w * 1e6 for w in windows_ms),
        projected=projected,
    )


def _line(original_ms: list[float], fixed_ms: list[float], projected: Projected | None) -> str:
    result = Verification(_profiled(original_ms, projected), _profiled(fixed_ms), True, None, False)
    return next(line for line in render(result) if line.startswith("speed-up"))


ORIGINAL = [300.0, 290.0, 310.0, 305.0, 295.0]


def test_a_speed_up_inside_the_projected_range_says_so_with_its_noise() -> None:
    line = _line(ORIGINAL, [180.0, 175.0, 185.0, 178.0, 182.0], Projected(PROJECTED))
    assert line.startswith("speed-up: measured 1.67x (noise 1.62-1.71x: each run's")
    assert line.endswith("projected 1.35-2.40x: inside the projected range")


def test_a_speed_up_just_below_the_range_within_its_noise_is_no_miss() -> None:
    # GIVEN a measurement of 1.33x whose noise reaches past the projected low end, 1.35x
    line = _line(ORIGINAL, [225.0, 220.0, 230.0, 226.0, 222.0], Projected(PROJECTED))
    assert "measured 1.33x" in line
    assert line.endswith("below the projected range, its noise range reaching it")


def test_a_speed_up_below_the_range_beyond_its_noise_is_a_miss() -> None:
    line = _line(ORIGINAL, [270.0, 268.0, 272.0, 269.0, 271.0], Projected(PROJECTED))
    assert "measured 1.11x" in line
    assert line.endswith("BELOW the projected range, its noise range too")


def test_above_a_floor_is_what_a_floor_says_and_above_a_range_is_not() -> None:
    floor = Projected(Stat(1.07, 1.06, 1.07, 10), floor=True)
    fast = [100.0, 98.0, 102.0, 99.0, 101.0]
    assert _line(ORIGINAL, fast, floor).endswith(
        "projected 1.06-1.07x, read as a floor: at or above the projected floor"
    )
    above = _line(ORIGINAL, fast, Projected(PROJECTED))
    assert above.endswith("above the projected range, its noise range too")


def test_no_projection_is_said_with_the_reports_reason() -> None:
    omitted = Projected(None, omitted="window time varies more than the predicted gain")
    line = _line(ORIGINAL, ORIGINAL, omitted)
    assert line.startswith("speed-up: measured 1.00x")
    assert line.endswith("not projected: window time varies more than the predicted gain")
    assert _line(ORIGINAL, ORIGINAL, None).endswith("each run's window-time quartiles)")
    assert _line([], ORIGINAL, None) == "speed-up: not measured (a run without a complete window)"


def test_the_projection_is_read_from_the_original_report() -> None:
    figures: dict[str, Any] = {
        "projection": {
            "speedup": {"median": 1.07, "low": 1.06, "high": 1.07, "n": 10},
            "floor": True,
            "omitted": None,
        }
    }
    read = _summarize({"ranks": [], "findings": [], "figures": figures}, "").projected
    assert read == Projected(Stat(1.07, 1.06, 1.07, 10), True, "")
    figures["projection"] = {"speedup": None, "omitted": "too few steady windows (1; ...)"}
    read = _summarize({"figures": figures}, "").projected
    assert read == Projected(None, False, "too few steady windows (1; ...)")
    assert _summarize({"figures": {"projection": None}}, "").projected is None
