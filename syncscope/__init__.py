"""syncscope: find redundant, missing and misplaced gradient synchronizations.

``import syncscope`` stays light (no torch import); ``syncscope.track`` imports torch when
first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from syncscope._version import __version__

if TYPE_CHECKING:
    from syncscope.testing.track import Stats, track

__all__ = ["Stats", "__version__", "track"]


def __getattr__(name: str) -> Any:
    if name in ("track", "Stats"):
        import importlib

        return getattr(importlib.import_module("syncscope.testing.track"), name)
    raise AttributeError(f"module 'syncscope' has no attribute {name!r}")
