"""Run a callback when a module is imported (or now, if it already is).

FSDP2's module pulls in about 600 others (dynamo, sympy, ...): importing it eagerly would
cost every DDP job seconds per rank, so its hooks are installed when the job imports it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from syncscope.capture.hooks.opaque import no_frame


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, callback: Callable[[ModuleType], None]) -> None:
        self.inner = inner
        self.callback = callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        self.callback(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class PostImportHook(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.callback = callback
        self._searching = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name or self._searching:
            return None
        self._searching = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._searching = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, self._fire)
        return spec

    def _fire(self, module: ModuleType) -> None:
        self.remove()
        self.callback(module)

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


# A hook waiting for a module the job never imports (DeepSpeed's engine in a job without it)
# stays in sys.meta_path: Dynamo must never start a frame in it when a compiled region imports
# something (one more compiled frame than the job's own, tests/integration/test_compile.py)
no_frame(PostImportHook.find_spec)
no_frame(PostImportHook._fire)


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> Callable[[], None]:
    """Call ``callback(module)`` once ``name`` is imported; returns a canceller."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return lambda: None
    hook = PostImportHook(name, callback)
    sys.meta_path.insert(0, hook)
    return hook.remove
