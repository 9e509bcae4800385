"""Text helpers (``syncscope.text``): bytes and durations in one form for every output, "n/a"
for what was not measured."""

from __future__ import annotations

from syncscope.render import terminal
from syncscope.text import human_bytes, human_ns


def test_human_units_say_not_measured_and_keep_their_forms() -> None:
    assert human_bytes(None) == human_ns(None) == "n/a"
    assert [human_bytes(n) for n in (0, 1023, 1536, 3 << 20)] == [
        "0 B",
        "1023 B",
        "1.5 KiB",
        "3.0 MiB",
    ]
    assert [human_ns(n) for n in (0, 640, 1_500, 12_300_000, 2_500_000_000)] == [
        "0 ns",
        "640 ns",
        "2 µs",
        "12.3 ms",
        "2.50 s",
    ]
    # the terminal's tables and findings show whole microseconds below a millisecond
    assert [terminal.human_ns(n) for n in (0, 640, 1_500, 12_300_000)] == [
        "0 µs",
        "1 µs",
        "2 µs",
        "12.3 ms",
    ]
