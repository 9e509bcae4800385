"""The compiled kernel for DDP's bucket all-reduces (``c10d_kernel.cpp``), where it can be had.

syncscope's Python kernel (``syncscope.capture.collectives``) costs each collective it sees
a Python frame: entering it from the dispatcher, converting the op's arguments, walking the
stack for the issuer: on a small DDP step, the largest single part of what capture costs
(x1.023 of a 4 x 512 MLP rank's CPU time, most of it in gloo's threads: see docs/concepts.md).
The compiled kernel sits in front of the Python one, at the ``Autograd`` key of
``c10d::allreduce_``, and records the calls that are DDP bucket all-reduces (issued straight
from the autograd engine, inside a backward the recorder saw) itself: the same record, in the
same order, to the same sink. Every other call goes on to the Python kernel (then at
``ADInplaceOrView``), unchanged. The same module holds ``GradSampler``, the copy of a gradient
fingerprint's samples at an optimizer step (``syncscope.capture.fingerprint``): the bytes
torch's views and ``torch.cat`` copy, in one call.

It is C++ built against the torch in use (torch's C++ ABI changes between releases, so no
wheel could ship it): ``torch.utils.cpp_extension`` compiles it once per source, torch and
Python (about 25 s on 2 cores), into torch's extension directory. ``syncscope profile``
builds it before launching ranks where a C++ compiler is found, and passes the result to
the ranks (``NATIVE_PATH_ENV``); anything else (``track()``, the pytest plugin, ``attach``)
uses it only if it was built before. Without it capture records exactly the same, at the
Python kernel's cost; the header of each rank's event file says which kernel ran and why.
``SYNCSCOPE_NATIVE=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import os
import sys
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("c10d_kernel.cpp")
ENV = "SYNCSCOPE_NATIVE"  # "0": never use the compiled kernel
NATIVE_PATH_ENV = "SYNCSCOPE_NATIVE_PATH"  # the built module, set by `syncscope profile`

_loaded: list[Any] = []  # [module] once imported in this process
_why_not: list[str] = []  # [reason] once it could not be had


def module_name() -> str:
    """The extension's name: one per source, torch and Python (a change rebuilds it)."""
    import torch

    digest = hashlib.sha256()
    digest.update(SOURCE.read_bytes())
    digest.update(torch.__version__.encode())
    digest.update(sys.version.encode())
    return f"syncscope_c10d_{digest.hexdigest()[:16]}"


def built_path() -> Path:
    """Where ``torch.utils.cpp_extension`` puts the built module."""
    from torch.utils.cpp_extension import _get_build_directory

    name = module_name()
    with contextlib.redirect_stdout(io.StringIO()):
        directory = _get_build_directory(name, verbose=False)
    return Path(directory) / f"{name}.so"


def _import(path: Path) -> Any:
    import torch  # noqa: F401 (the module links against torch's libraries, loaded first)

    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def disabled() -> bool:
    return os.environ.get(ENV, "") == "0"


def build() -> tuple[Path | None, str]:
    """Build the module unless built already: (its path, "") or (None, why not). Quiet: the
    compiler's output is kept, and only its last line is told."""
    if disabled():
        return None, f"{ENV}=0"
    try:
        path = built_path()
        if path.is_file():
            return path, ""
        from torch.utils.cpp_extension import load

        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            load(module_name(), [str(SOURCE)], extra_cflags=["-O2"], verbose=False)
        if path.is_file():
            return path, ""
        return None, "the build left no module"
    except Exception as exc:  # no compiler, no ninja, an unwritable cache, a torch without headers
        lines = [line for line in str(exc).splitlines() if line.strip()]
        return None, f"cannot build it: {lines[-1] if lines else type(exc).__name__}"


def get() -> Any | None:
    """The compiled module, if built (never built here); None, with ``why_not()``, if not."""
    if _loaded:
        return _loaded[0]
    if _why_not:
        return None
    reason = ""
    if disabled():
        reason = f"{ENV}=0"
    else:
        try:
            given = os.environ.get(NATIVE_PATH_ENV, "")
            path = Path(given) if given else built_path()
            if path.is_file():
                _loaded.append(_import(path))
                return _loaded[0]
            reason = "not built" if not given else f"{given} is missing"
        except Exception as exc:
            reason = f"cannot load it: {exc}"
    _why_not.append(reason)
    return None


def describe() -> str:
    """For the event file's header: "compiled", or "python (why)"."""
    return "compiled" if get() is not None else f"python ({why_not()})"


def failed(reason: str) -> None:
    """The module loaded but its kernel could not be registered: not used from now on."""
    _loaded.clear()
    _why_not[:] = [reason]


def why_not() -> str:
    """Why ``get()`` found no module ("" if it did, or was not asked)."""
    return _why_not[0] if _why_not else ""
