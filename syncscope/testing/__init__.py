"""Test helpers: assert sync counts, and run a function on N local ranks.

``import syncscope.testing`` does not import torch; ``spawn`` and ``assert_syncs`` do when
called.
"""

from __future__ import annotations

from syncscope.testing.asserts import assert_syncs
from syncscope.testing.spawn import spawn

__all__ = ["assert_syncs", "spawn"]
