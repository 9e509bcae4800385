"""Find the user's call site and the library that issued a call, from the Python stack.

A frame is *library* when its file lies in the interpreter's own directories (the standard
library, site-packages), in syncscope itself, under a ``site-packages``/``dist-packages``
directory, or in a top-level package of an installed distribution found through another
``sys.path`` entry (``PYTHONPATH``, ``pip --target``, a module system's tree), unless it lies
in the user's script directory; the first non-library frame up the stack is the user's call
site. What was imported decides, never a substring of the path. Results are cached per code
object, so a lookup costs a short walk of the stack.
"""

from __future__ import annotations

import ast
import os
import sys
import sysconfig
from types import CodeType, FrameType

_SYNCSCOPE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # syncscope/
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

# torch's own call plumbing, never the issuer of a collective
_PLUMBING = ("/_python_dispatch.py", "/_ops.py", "/torch/_compile.py")


_user_files: dict[CodeType, str] = {}  # code object -> its absolute file name, "" if library


def _user_file(code: CodeType) -> str:
    """The absolute file name of the user's code object, or "" for library code (cached)."""
    name = _user_files.get(code)
    if name is None:
        filename = code.co_filename
        path = "" if filename.startswith("<") else os.path.abspath(filename)
        name = "" if not path or is_library_path(path) else path
        _user_files[code] = name
    return name


_PACKAGE_DIRS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
_distributions: dict[str, list[str]] | None = None  # top-level name -> distributions


def _installed(top: str) -> bool:
    """Whether ``top`` is a top-level package or module of an installed distribution."""
    global _distributions
    if _distributions is None:
        try:
            from importlib.metadata import packages_distributions

            _distributions = dict(packages_distributions())
        except Exception:  # a broken distribution's metadata: judge by the paths alone
            _distributions = {}
    return top in _distributions


def _script_dir() -> str:
    main = sys.modules.get("__main__")
    file = getattr(main, "__file__", None) or (sys.argv[0] if sys.argv else "")
    return os.path.dirname(os.path.abspath(file)) if file else ""


def is_library_path(path: str) -> bool:
    """Whether the absolute ``path`` is library code (see the module's docstring)."""
    if path.startswith(_LIBRARY_PREFIXES) or any(d in path for d in _PACKAGE_DIRS):
        return True
    script_dir = _script_dir()
    if script_dir and path.startswith(script_dir + os.sep):
        return False  # the user's own, even where an installed name matches
    for entry in sys.path:
        root = os.path.abspath(entry or os.curdir)
        if root == script_dir or not path.startswith(root + os.sep):
            continue
        top = path[len(root) + 1 :].split(os.sep, 1)[0].removesuffix(".py")
        if _installed(top):
            return True
    return False


def _is_library(code: CodeType) -> bool:
    return not _user_file(code)


SiteDict = dict[str, object]
# (code, last instruction) -> the site's dict as events carry it ({"file", "line",
# "function"}): built once per call site, then shared by every event from there (events
# are never mutated; reading ``f_lineno`` decodes the line table, building the dict
# allocates: neither is done again for a call site already seen).
_site_dicts: dict[tuple[CodeType, int], SiteDict] = {}


def _site_of(frame: FrameType, code: CodeType, file: str) -> SiteDict:
    key = (code, frame.f_lasti)
    site = _site_dicts.get(key)
    if site is None:
        if len(_site_dicts) > 4096:  # call sites are few; never grows without bound
            _site_dicts.clear()
        line = frame.f_lineno
        site = _site_dicts[key] = {"file": file, "line": line, "function": code.co_name}
        within = enclosing_withs(file, line)
        if within:
            site["within"] = within
    return site


# context managers that are no sync helper: they never change gradient sync
_NOT_HELPERS = frozenset(
    {
        "nullcontext",
        "no_grad",
        "enable_grad",
        "inference_mode",
        "set_grad_enabled",
        "autocast",
        "record_function",
        "profile",
        "open",
        "suppress",
        "ExitStack",
        "sdpa_kernel",
        "accumulate",  # Accelerate's, recorded by its own hooks
    }
)
_HELPER_WORDS = ("sync", "accum", "reduce", "ddp", "fsdp")
_withs_by_file: dict[str, dict[int, list[dict[str, object]]]] = {}
_MAX_SOURCE_BYTES = 4 << 20


def _helper_calls(expr: ast.expr) -> list[str]:
    """Names of the calls a ``with`` item enters: ``helper(...)``, or either branch of
    ``helper(...) if cond else contextlib.nullcontext()``."""
    if isinstance(expr, ast.IfExp):
        return _helper_calls(expr.body) + _helper_calls(expr.orelse)
    if not isinstance(expr, ast.Call):
        return []
    name = ast.unparse(expr.func)
    last = name.rsplit(".", 1)[-1]
    if last in _NOT_HELPERS or len(name) > 80:
        return []
    # a sync helper says so in its name (no_sync, grad_sync_context, maybe_skip_allreduce):
    # a progress bar, a timer or a profiler around the loop is none
    return [name] if any(word in last.lower() for word in _HELPER_WORDS) else []


def _index_withs(path: str) -> dict[int, list[dict[str, object]]]:
    """Line -> the ``with`` statements whose body holds it (outermost first), for a file."""
    index: dict[int, list[dict[str, object]]] = {}
    try:
        if os.path.getsize(path) > _MAX_SOURCE_BYTES:
            return index
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return index
    for node in ast.walk(tree):
        if not isinstance(node, (ast.With, ast.AsyncWith)) or not node.body:
            continue
        names = [name for item in node.items for name in _helper_calls(item.context_expr)]
        if not names:
            continue
        entry: dict[str, object] = {"line": node.lineno, "call": names[0]}
        end = node.end_lineno or node.body[-1].lineno
        for line in range(node.body[0].lineno, end + 1):
            index.setdefault(line, []).append(entry)
    for entries in index.values():
        entries.sort(key=lambda e: int(str(e["line"])))
    return index


def enclosing_withs(file: str, line: int) -> list[dict[str, object]]:
    """The ``with`` statements of the user's source that hold ``file:line`` in their body,
    outermost first, as ``{"line", "call"}``, of calls whose name speaks of syncing
    (``sync``, ``accum``, ``reduce``, ``ddp``, ``fsdp``; known context managers that never
    change it left out): a sync helper the user wrapped around forward and backward. Read once
    per file, from the call site's first lookup (never on a hot path)."""
    index = _withs_by_file.get(file)
    if index is None:
        index = _withs_by_file[file] = _index_withs(file)
    return index.get(line, [])


def within_outside_forward(skip: int = 1, depth: int = 24) -> list[dict[str, object]]:
    """``enclosing_withs`` of the first user frame above the caller that is not a module's
    ``forward``: a wrapper called from the user's own module (``Outer.forward`` calling the
    DDP module) was entered from the training loop further up."""
    frame: FrameType | None = sys._getframe(skip + 1)
    while frame is not None and depth > 0:
        code = frame.f_code
        file = _user_file(code)
        if file and code.co_name not in ("forward", "__call__", "_call_impl"):
            return [{"file": file, **e} for e in enclosing_withs(file, frame.f_lineno)]
        frame = frame.f_back
        depth -= 1
    return []


# Where the user's frame was found last, per kind of hook: (its depth above the caller, its
# code, whether the walk passed the function user_site_through looks for, its file). Walking the
# stack makes Python build a frame object for every frame passed (the hook's own callers:
# DDP's, contextlib's, torch's wrappers), about 15 us a walk inside a training step. A
# hook called again from the same place (every micro-batch, every step) finds the same
# user code at the same depth, so it looks at that one frame first: ``sys._getframe(n)``
# builds no frame object for the frames it skips. A different path to the same user code
# at the same depth would give that outer frame rather than the innermost user one; a
# path of another depth or through other user code is walked in full.
_hints: dict[str, tuple[int, CodeType, bool, str]] = {}  # (depth, code, through, file)


def _walk(
    frame: FrameType | None, key: str | None, function: str, within: int
) -> tuple[SiteDict | None, bool]:
    files = _user_files
    through = False
    depth = 0
    while frame is not None:
        code = frame.f_code
        if depth < within:
            through = through or code.co_name == function
        name = files.get(code)
        if name is None:
            name = _user_file(code)
        if name:
            if key is not None:
                _hints[key] = (depth, code, through, name)
            return _site_of(frame, code, name), through
        frame = frame.f_back
        depth += 1
    return None, through


def user_site(skip: int = 1, key: str | None = None) -> SiteDict | None:
    """The innermost frame of the user's own code above the caller, as the site dict events
    carry ({"file", "line", "function"}; shared, never to be mutated).

    ``key`` names the hook (one per call path): the frame found is remembered and looked at
    first next time (see ``_hints``).

    The hinted case is written out here and in ``user_site_through``, not shared: a shared
    helper (or this calling ``user_site_through``) added 270-330 bytecodes to each window of
    the small MLP step (``benchmarks/internals/hook_bytecodes.py``: 5,914 -> 6,188 / 6,240), every
    hook of every micro-batch coming through one of the two."""
    if key is not None and (hint := _hints.get(key)) is not None:
        try:
            frame = sys._getframe(skip + 1 + hint[0])
        except ValueError:
            pass
        else:
            if frame.f_code is hint[1]:
                site = _site_dicts.get((hint[1], frame.f_lasti))
                return site if site is not None else _site_of(frame, hint[1], hint[3])
    return _walk(sys._getframe(skip + 1), key, "", 0)[0]


def user_site_through(
    skip: int, function: str, within: int, key: str | None = None
) -> tuple[SiteDict | None, bool]:
    """``user_site(skip)``, and whether one of the ``within`` frames above the caller runs a
    function named ``function`` (a sync flag set from inside ``no_sync``): one walk."""
    if key is not None and (hint := _hints.get(key)) is not None:
        try:
            frame = sys._getframe(skip + 1 + hint[0])
        except ValueError:
            pass
        else:
            if frame.f_code is hint[1]:
                site = _site_dicts.get((hint[1], frame.f_lasti))
                if site is None:
                    site = _site_of(frame, hint[1], hint[3])
                return site, hint[2]
    return _walk(sys._getframe(skip + 1), key, function, within)


_TORCH_MARKERS = (
    ("/torch/distributed/fsdp/", "fsdp"),
    ("/torch/distributed/_composable/fsdp/", "fsdp"),
    ("/torch/nn/parallel/distributed.py", "ddp"),
    ("/torch/distributed/algorithms/ddp_comm_hooks/", "ddp"),
    ("/torch/distributed/tensor/", "torch"),
    (
        "/deepspeed/",
        "deepspeed",
    ),  # DeepSpeed's engine and ZeRO optimizers (not torch)  # DTensor / tensor parallelism's own collectives
    # a compiled-autograd backward graph (DDP's Python reducer): as from the autograd engine
    ("/torch/_dynamo/compiled_autograd.py", "autograd"),
)


# what a frame's code says about who issues a collective, cached per code object:
# (wrapper kind from _TORCH_MARKERS or "", through torch.distributed's Python API,
#  a torch frame that is not call plumbing, the autograd engine's entry from Python)
_Role = tuple[str, bool, bool, bool]
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
        engine = filename.endswith("/torch/autograd/graph.py") and (
            code.co_name == "_engine_run_backward"
        )
        role = _roles[code] = (kind, c10d, torch_frame, engine)
    return role


def issuer_of_collective(skip: int = 1) -> tuple[str, SiteDict | None, str]:
    """Classify who issued the collective being dispatched.

    Returns (issuer, user call site, detail). ``issuer`` is "fsdp" or "ddp" when a frame of
    those wrappers is on the stack, "user" when the innermost non-library frame called it
    through ``torch.distributed``, "autograd" when the stack enters it straight from the
    autograd engine (DDP's C++ reducer), and "torch" otherwise. What each frame's code says
    is cached per code object: a collective costs a short walk of dictionary lookups.

    A collective whose first torch frame is the autograd engine's entry (no Python frame of
    torch between: DDP's C++ reducer, a C++ comm hook) is "autograd" as soon as that frame
    is met: the frames above it are the backward's caller, which no wrapper is (walking them
    made every DDP bucket build a frame object per caller frame).
    """
    frame: FrameType | None = sys._getframe(skip + 1)
    innermost_torch: CodeType | None = None
    via_c10d_python = False
    while frame is not None:
        code = frame.f_code
        user_file = _user_file(code)
        if user_file:
            if via_c10d_python:
                return ("user", _site_of(frame, code, user_file), "")
            break
        kind, c10d, torch_frame, engine = _role(code)
        if kind:
            return (kind, None, _fsdp_module(frame) if kind == "fsdp" else code.co_name)
        via_c10d_python = via_c10d_python or c10d
        if innermost_torch is None and torch_frame:
            if engine:
                return ("autograd", None, "")
            innermost_torch = code
        frame = frame.f_back
    if via_c10d_python:
        return ("torch", None, "")
    if innermost_torch is None or "/torch/autograd/" in innermost_torch.co_filename.replace(
        "\\", "/"
    ):
        return ("autograd", None, "")
    return ("torch", None, "")


def setter_mentions(names: tuple[str, ...], skip: int = 1) -> list[dict[str, object]]:
    """Where the user's function that called the model (the innermost user frame that is
    not a ``forward``) names one of ``names`` (an FSDP sync setter): file and line of each
    mention. Read once, when an FSDP root is first seen: whether the loop meant to toggle a
    sync the run then never saw toggled (a setter looked up on a module that is not FSDP's)."""
    import inspect

    frame: FrameType | None = sys._getframe(skip + 1)
    while frame is not None:
        code = frame.f_code
        file = _user_file(code)
        if file and code.co_name != "forward":
            try:
                lines, first = inspect.getsourcelines(code)
            except (OSError, TypeError):
                return []
            calls = [i for i, text in enumerate(lines) if any(f".{n}(" in text for n in names)]
            named = [i for i, text in enumerate(lines) if any(n in text for n in names)]
            ordered = calls + [i for i in named if i not in calls]  # the calls first
            return [{"file": file, "line": max(first, 1) + i} for i in ordered[:8]]
        frame = frame.f_back
    return []


_DRIVERS = (("/torch/distributed/pipelining/", "pipelining"),)


def driver_of_collective(skip: int = 1) -> str:
    """What drives a wrapper's collective issued outside autograd: "pipelining" when a frame
    of ``torch.distributed.pipelining`` (a schedule's reduction after its last backward) is
    on the stack, else "". Walks the whole stack: called for such rare collectives only."""
    frame: FrameType | None = sys._getframe(skip + 1)
    while frame is not None:
        filename = frame.f_code.co_filename.replace("\\", "/")
        for part, name in _DRIVERS:
            if part in filename:
                return name
        frame = frame.f_back
    return ""


def _fsdp_module(frame: FrameType | None) -> str:
    """The FSDP module whose gradients are being reduced (its fully-qualified name)."""
    while frame is not None:
        owner = frame.f_locals.get("self")
        name = getattr(owner, "_module_fqn", None)
        if isinstance(name, str):
            return name
        frame = frame.f_back
    return "fsdp"
