"""The styles a fix can take (``syncscope fix --style``).

Apart from the codemod, which imports libcst, so that the command line can list and check
them without importing it.
"""

from __future__ import annotations

from typing import Literal

Style = Literal["auto", "accelerate", "no_sync", "flag", "fsdp2"]
STYLES: tuple[Style, ...] = ("auto", "accelerate", "no_sync", "flag", "fsdp2")
