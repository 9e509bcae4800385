"""The installed torch's release, where syncscope does one thing or another by release
(docs/torch-versions.md: what differs between releases)."""

from __future__ import annotations

import re

__all__ = ["torch_release"]


def torch_release() -> tuple[int, int]:
    """The installed torch's (major, minor): ``2.7.1+cu126`` is (2, 7); (0, 0) if unreadable."""
    import torch

    found = re.match(r"(\d+)\.(\d+)", str(torch.__version__))
    return (int(found[1]), int(found[2])) if found else (0, 0)
