"""Find the user's call site and the library that issued a call, from the Python stack.

A frame is *library* when its file lies in the standard library, in site-packages, in torch
or in syncscope itself; the first non-library frame up the stack is the user's call site.
Results are cached per code object, so a lookup costs a short walk of the stack.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from types import CodeType, FrameType

import syncscope

_SYNCSCOPE_DIR = os.path.dirname(os.path.abspath(syncscope.__file__))
_LIBRARY_PREFIXES: tuple[str, ...] = tuple(
    {
        os.path.abspath(p)
        for p in (
            sysconfig.get_paths().get("stdlib", ""),
            sysconfig.get_paths().get("platstdlib", ""),
            sysconfig.get_paths().get("purelib", ""),
            sysconfig.get_paths().get("platlib", ""),
            _SYNCSCOPE_DIR,
        )
        if p
    }
)

Site = tuple[str, int, str]
# torch's own call plumbing, never the issuer of a collective
_PLUMBING = ("/_python_dispatch.py", "/_ops.py", "/torch/_compile.py")


_user_files: dict[CodeType, str] = {}  # code object -> its absolute file name, "" if library


def _user_file(code: CodeType) -> str:
    """The absolute file name of the user's code object, or "" for library code (cached)."""
    name = _user_files.get(code)
    if name is None:
        filename = code.co_filename
        path = "" if filename.startswith("<") else os.path.abspath(filename)
        library = (
            not path
            or "site-packages" in filename
            or "dist-packages" in filename
            or path.startswith(_LIBRARY_PREFIXES)
        )
        name = "" if library else path
        _user_files[code] = name
    return name


def _is_library(code: CodeType) -> bool:
    return not _user_file(code)


def user_site(skip: int = 1) -> Site | None:
    """The innermost frame of the user's own code above the caller, as (file, line, function).

    Called on every micro-batch: a dictionary lookup per frame walked, nothing else."""
    frame: FrameType | None = sys._getframe(skip + 1)
    files = _user_files
    while frame is not None:
        code = frame.f_code
        name = files.get(code)
        if name is None:
            name = _user_file(code)
        if name:
            return (name, frame.f_lineno, code.co_name)
        frame = frame.f_back
    return None


def site_dict(site: Site | None) -> dict[str, object] | None:
    if site is None:
        return None
    return {"file": site[0], "line": site[1], "function": site[2]}


_TORCH_MARKERS = (
    ("/torch/distributed/fsdp/", "fsdp"),
    ("/torch/distributed/_composable/fsdp/", "fsdp"),
    ("/torch/nn/parallel/distributed.py", "ddp"),
    ("/torch/distributed/algorithms/ddp_comm_hooks/", "ddp"),
    ("/torch/distributed/tensor/", "torch"),  # DTensor / tensor parallelism's own collectives
    # a compiled-autograd backward graph (DDP's Python reducer): as from the autograd engine
    ("/torch/_dynamo/compiled_autograd.py", "autograd"),
)


# what a frame's code says about who issues a collective, cached per code object:
# (wrapper kind from _TORCH_MARKERS or "", through torch.distributed's Python API,
#  a torch frame that is not call plumbing)
_Role = tuple[str, bool, bool]
_roles: dict[CodeType, _Role] = {}


def _role(code: CodeType) -> _Role:
    role = _roles.get(code)
    if role is None:
        filename = code.co_filename.replace("\\", "/")
        kind = next((k for marker, k in _TORCH_MARKERS if marker in filename), "")
        c10d = (
            "/torch/distributed/distributed_c10d.py" in filename
            or "/torch/distributed/c10d" in filename
            or "/torch/distributed/_functional_collectives.py" in filename
        )
        torch_frame = (
            "/torch/" in filename
            and not filename.endswith(_PLUMBING)
            and "/torch/_dynamo/" not in filename
        )
        role = _roles[code] = (kind, c10d, torch_frame)
    return role


def issuer_of_collective(skip: int = 1) -> tuple[str, Site | None, str]:
    """Classify who issued the collective being dispatched.

    Returns (issuer, user call site, detail). ``issuer`` is "fsdp" or "ddp" when a frame of
    those wrappers is on the stack, "user" when the innermost non-library frame called it
    through ``torch.distributed``, "autograd" when the stack enters it straight from the
    autograd engine (DDP's C++ reducer), and "torch" otherwise. What each frame's code says
    is cached per code object: a collective costs a short walk of dictionary lookups.
    """
    frame: FrameType | None = sys._getframe(skip + 1)
    innermost_torch: CodeType | None = None
    via_c10d_python = False
    while frame is not None:
        code = frame.f_code
        user_file = _user_file(code)
        if user_file:
            if via_c10d_python:
                return ("user", (user_file, frame.f_lineno, code.co_name), "")
            break
        kind, c10d, torch_frame = _role(code)
        if kind:
            return (kind, None, _fsdp_module(frame) if kind == "fsdp" else code.co_name)
        via_c10d_python = via_c10d_python or c10d
        if innermost_torch is None and torch_frame:
            innermost_torch = code
        frame = frame.f_back
    if via_c10d_python:
        return ("torch", None, "")
    if innermost_torch is None or "/torch/autograd/" in innermost_torch.co_filename.replace(
        "\\", "/"
    ):
        return ("autograd", None, "")
    return ("torch", None, "")


def _fsdp_module(frame: FrameType | None) -> str:
    """The FSDP module whose gradients are being reduced (its fully-qualified name)."""
    while frame is not None:
        owner = frame.f_locals.get("self")
        name = getattr(owner, "_module_fqn", None)
        if isinstance(name, str):
            return name
        frame = frame.f_back
    return "fsdp"
