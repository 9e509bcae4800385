"""Which training framework drives the job, from the Python stack (Lightning, the HF
Trainer, Accelerate): recorded once, so fixes can name that framework's own knobs."""

from __future__ import annotations

import sys
from typing import Any

from syncscope.capture import sites

# Training frameworks recognised from the stack at a wrapper's creation or an optimizer step,
# most specific first (the HF Trainer runs on Accelerate; Lightning may import either).
FRAMEWORKS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    (
        "lightning",
        ("/lightning/pytorch/", "/pytorch_lightning/"),
        ("lightning", "pytorch_lightning"),
    ),
    ("transformers", ("/transformers/trainer",), ("transformers",)),
    ("accelerate", ("/accelerate/",), ("accelerate",)),
)


def detect_framework(skip: int = 1) -> tuple[str, str] | None:
    """(name, version) of the training framework whose code is on the stack, if any."""
    seen: set[str] = set()
    frame: Any = sys._getframe(skip + 1)
    while frame is not None:
        filename = frame.f_code.co_filename.replace("\\", "/")
        if not sites._is_library(frame.f_code):
            frame = frame.f_back  # the user's own files never name a framework
            continue
        for name, markers, _ in FRAMEWORKS:
            if name not in seen and any(m in filename for m in markers):
                seen.add(name)
        frame = frame.f_back
    for name, _, modules in FRAMEWORKS:
        if name in seen:
            version = ""
            for module_name in modules:
                module = sys.modules.get(module_name)
                if module is not None and getattr(module, "__version__", None):
                    version = str(module.__version__)
                    break
            return name, version
    return None
