"""A Flight Recorder dump's bytes as plain data, in time and memory bounded by its size.

torch writes a dump as a pickle of dicts, lists, tuples, strings and numbers (or as JSON).
Python's C unpickler trusts its input: a memo opcode with a huge index allocates gigabytes
before anything is checked (23 bytes asked for 2.1 GB), and a dict key that is a tuple nested
a few hundred thousand deep overflows the C stack when it is hashed. So pickles are read by
Python's own unpickler (``pickle._Unpickler``: the memo is a dict, nothing is sized by an
opcode's argument) with a dispatch table that holds the data opcodes only:

- refused: every class or function a pickle names (``GLOBAL``, ``STACK_GLOBAL``, refused by
  name), every opcode that builds an object or brings outside data in (``REDUCE``,
  ``BUILD``, ``INST``, ``OBJ``, ``NEWOBJ``, ``NEWOBJ_EX``, ``PERSID``, ``BINPERSID``,
  ``EXT1``/``2``/``4``, ``BYTEARRAY8``, ``NEXT_BUFFER``, ``READONLY_BUFFER``), sets and
  frozensets (their members are hashed), and integers of over 255 bytes (``LONG4``);
- a dict key must be a string, a number, bytes or None (no tuple: hashing one recurses).

Reading is linear in the file's bytes (about 5 MB/s for a pickle, in one pass); what the
result may reference several times over (shared references) is bounded where the fields are
read (``syncscope.load.flight``). JSON is read by the ``json`` module, whose nesting limit
raises ``RecursionError``; both end as ``ValueError`` here, one line.
"""

from __future__ import annotations

import io
import json
import pickle
import pickletools
from collections.abc import Callable
from typing import Any

__all__ = ["REFUSED_OPCODES", "decode_json", "decode_pickle"]

REFUSED_OPCODES = frozenset(
    {
        "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX",
        "PERSID", "BINPERSID", "EXT1", "EXT2", "EXT4", "BYTEARRAY8", "NEXT_BUFFER",
        "READONLY_BUFFER", "EMPTY_SET", "ADDITEMS", "FROZENSET", "LONG4",
    }
)  # fmt: skip
_KEY_TYPES = (str, int, float, bytes, type(None))
_NAMES = {op.code.encode("latin-1")[0]: op.name for op in pickletools.opcodes}

Handler = Callable[[Any], None]


def _refuse(code: int) -> Handler:
    name = _NAMES.get(code)
    what = f"opcode {name}" if name else f"unknown opcode 0x{code:02x}"

    def refuse(self: Any) -> None:
        raise pickle.UnpicklingError(f"refused {what}: a dump holds data only")

    return refuse


def _key(key: object) -> object:
    if not isinstance(key, _KEY_TYPES):
        raise pickle.UnpicklingError(
            f"refused a dict key of type {type(key).__name__}: a dump's keys are strings"
        )
    return key


def _setitems(self: Any) -> None:
    items = self.pop_mark()
    target = self.stack[-1]
    if not isinstance(target, dict):
        raise pickle.UnpicklingError("SETITEMS on a value that is not a dict")
    for i in range(0, len(items) - 1, 2):
        target[_key(items[i])] = items[i + 1]


def _setitem(self: Any) -> None:
    stack = self.stack
    value = stack.pop()
    key = stack.pop()
    if not isinstance(stack[-1], dict):
        raise pickle.UnpicklingError("SETITEM on a value that is not a dict")
    stack[-1][_key(key)] = value


def _dict(self: Any) -> None:
    items = self.pop_mark()
    self.append({_key(items[i]): items[i + 1] for i in range(0, len(items) - 1, 2)})


def _dispatch() -> dict[int, Handler]:
    table: dict[int, Handler] = {code: _refuse(code) for code in range(256)}
    for code, handler in pickle._Unpickler.dispatch.items():  # type: ignore[attr-defined]
        if _NAMES.get(code) not in REFUSED_OPCODES:
            table[code] = handler
    for name, handler in (("SETITEMS", _setitems), ("SETITEM", _setitem), ("DICT", _dict)):
        table[getattr(pickle, name)[0]] = handler
    return table


class _DataOnly(pickle._Unpickler):  # type: ignore[name-defined,misc]
    dispatch = _dispatch()

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"refused to load {module[:100]}.{name[:100]}: a dump holds data only"
        )


def decode_pickle(data: bytes) -> object:
    """The pickle's value; ``ValueError`` (one line) for anything but plain data."""
    try:
        return _DataOnly(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise ValueError(str(exc).splitlines()[0] if str(exc) else "corrupt") from None
    except EOFError:
        raise ValueError("cut short: no STOP opcode") from None
    except (ValueError, TypeError, IndexError, KeyError, AttributeError, OverflowError) as exc:
        raise ValueError(f"corrupt ({type(exc).__name__}: {_first_line(exc)})") from None
    except (RecursionError, MemoryError) as exc:  # defensive: no path above recurses
        raise ValueError(f"corrupt ({type(exc).__name__})") from None


def decode_json(data: bytes) -> object:
    """The JSON's value; ``ValueError`` (one line) where it is not JSON or nests too deep."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested deeper than JSON is read (about 1,000 levels)") from None
    except (ValueError, TypeError) as exc:
        raise ValueError(_first_line(exc)) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__
