"""A Flight Recorder dump's bytes as plain data, in time and memory bounded by its size.

torch writes a dump as a pickle of dicts, lists, tuples, strings and numbers (or as JSON).
Python's C unpickler trusts its input: a memo opcode with a huge index allocates gigabytes
before anything is checked (23 bytes asked for 2.1 GB), and a dict key that is a tuple nested
a few hundred thousand deep overflows the C stack when it is hashed. So pickles are read here,
opcode by opcode, with the data opcodes only (protocols 1 to 5, as torch's and Python's
picklers write them); the memo is a table of what was stored, never sized by an index:

- refused: every class or function a pickle names (``GLOBAL``, ``STACK_GLOBAL``, refused by
  name), every opcode that builds an object or brings outside data in (``REDUCE``,
  ``BUILD``, ``INST``, ``OBJ``, ``NEWOBJ``, ``NEWOBJ_EX``, ``PERSID``, ``BINPERSID``,
  ``EXT1``/``2``/``4``, ``BYTEARRAY8``, ``NEXT_BUFFER``, ``READONLY_BUFFER``), sets and
  frozensets (their members are hashed), integers of over 255 bytes (``LONG4``) and
  protocol 0's text strings (``STRING``, ``UNICODE``);
- a dict key must be a string, a number, bytes or None (no tuple: hashing one recurses).

Reading is linear in the file's bytes (about 7 MB/s, in one pass, against about 20 for the C
unpickler); what the result may reference several times over (shared references) is bounded
where the fields are read (``flight_fields``). JSON is read by the ``json`` module, whose
nesting limit raises ``RecursionError``; both end as ``ValueError`` here, one line.
"""

from __future__ import annotations

import json
import pickletools
import struct
from collections.abc import Callable
from typing import Any

__all__ = ["MAX_PROTOCOL", "decode_json", "decode_pickle"]

_KEY_TYPES = (str, int, float, bytes, type(None))
_NAMES = {op.code.encode("latin-1")[0]: op.name for op in pickletools.opcodes}
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
_F64 = struct.Struct(">d")
MAX_PROTOCOL = 5


class _Refused(ValueError):
    pass


class _State:
    """The unpickler's state where a rarer opcode's handler needs it."""

    __slots__ = ("data", "i", "memo", "meta", "stack")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.i = 0
        self.stack: list[Any] = []
        self.meta: list[list[Any]] = []  # the stacks below each MARK
        self.memo: dict[int, Any] = {}

    def take(self, size: int) -> bytes:
        end = self.i + size
        if end > len(self.data):
            raise _Refused("cut short: an opcode's argument runs past the end")
        chunk = self.data[self.i : end]
        self.i = end
        return chunk

    def line(self) -> bytes:
        end = self.data.find(b"\n", self.i)
        if end < 0:
            raise _Refused("cut short: a line argument without its newline")
        chunk = self.data[self.i : end]
        self.i = end + 1
        return chunk

    def pop_mark(self) -> list[Any]:
        items = self.stack
        self.stack = self.meta.pop()
        return items


def _key(key: object) -> object:
    if not isinstance(key, _KEY_TYPES):
        raise _Refused(
            f"refused a dict key of type {type(key).__name__}: a dump's keys are strings"
        )
    return key


def _set_items(target: object, items: list[Any]) -> None:
    if not isinstance(target, dict) or len(items) % 2:
        raise _Refused("corrupt: dict items set on a value that is not a dict")
    for n in range(0, len(items), 2):
        key = items[n]
        target[key if type(key) is str else _key(key)] = items[n + 1]


def _extend(target: object, items: list[Any]) -> None:
    if not isinstance(target, list):
        raise _Refused("corrupt: list items appended to a value that is not a list")
    target.extend(items)


def _int_line(st: _State) -> None:
    text = st.line().rstrip(b"L")  # INT and LONG (protocol 0): decimal text
    if text in (b"00", b"01"):
        st.stack.append(text == b"01")
    else:
        st.stack.append(int(text))


def _refuse_global(st: _State) -> None:
    module = st.line().decode("utf-8", "replace")[:100]
    name = st.line().decode("utf-8", "replace")[:100]
    raise _Refused(f"refused to load {module}.{name}: a dump holds data only")


def _refuse_stack_global(st: _State) -> None:
    name, module = st.stack.pop(), st.stack.pop()
    raise _Refused(f"refused to load {str(module)[:100]}.{str(name)[:100]}: a dump holds data only")


def _text(size: int) -> Callable[[_State], None]:
    def load(st: _State) -> None:
        (length,) = (
            (_U64 if size == 8 else _U32).unpack(st.take(size)) if size > 1 else (st.take(1)[0],)
        )
        st.stack.append(str(st.take(length), "utf-8", "surrogatepass"))

    return load


def _raw(size: int, as_text: bool) -> Callable[[_State], None]:
    def load(st: _State) -> None:
        head = st.take(size)
        length = head[0] if size == 1 else (_U64 if size == 8 else _I32).unpack(head)[0]
        if length < 0:
            raise _Refused("corrupt: a negative length")
        chunk = st.take(length)
        st.stack.append(chunk.decode("latin-1") if as_text else chunk)

    return load


def _push(value: Callable[[_State], Any]) -> Callable[[_State], None]:
    def load(st: _State) -> None:
        st.stack.append(value(st))

    return load


def _put(st: _State, index: int) -> None:
    st.memo[index] = st.stack[-1]


def _get(st: _State, index: int) -> None:
    st.stack.append(st.memo[index])


def _proto(st: _State) -> None:
    if st.take(1)[0] > MAX_PROTOCOL:
        raise _Refused("corrupt: a pickle protocol above 5")


def _tuple(count: int) -> Callable[[_State], None]:
    def load(st: _State) -> None:
        items = st.stack[len(st.stack) - count :] if count else []
        if len(items) != count:
            raise _Refused("corrupt: a tuple of more items than the stack holds")
        del st.stack[len(st.stack) - count :]
        st.stack.append(tuple(items))

    return load


def _push_marked(st: _State, kind: Callable[[list[Any]], object]) -> None:
    items = st.pop_mark()  # first: it sets st.stack back to the stack below the mark
    st.stack.append(kind(items))


def _setitem(st: _State) -> None:
    value, key = st.stack.pop(), st.stack.pop()
    _set_items(st.stack[-1], [key, value])


def _dict(st: _State) -> None:
    items = st.pop_mark()
    target: dict[Any, Any] = {}
    _set_items(target, items)
    st.stack.append(target)


_RARE: dict[int, Callable[[_State], object]] = {
    0x80: _proto,
    0x95: lambda st: st.take(8) and None,  # FRAME: a framing hint; its opcodes follow inline
    0x30: lambda st: st.stack.pop() if st.stack else st.pop_mark() and None,  # POP
    0x31: lambda st: st.pop_mark() and None,  # POP_MARK
    0x32: lambda st: st.stack.append(st.stack[-1]),  # DUP
    0x4E: lambda st: st.stack.append(None),
    0x88: lambda st: st.stack.append(True),
    0x89: lambda st: st.stack.append(False),
    0x49: _int_line,  # INT
    0x4C: _int_line,  # LONG
    0x4A: _push(lambda st: _I32.unpack(st.take(4))[0]),  # BININT
    0x4D: _push(lambda st: _U16.unpack(st.take(2))[0]),  # BININT2
    0x8A: _push(lambda st: int.from_bytes(st.take(st.take(1)[0]), "little", signed=True)),
    0x46: _push(lambda st: float(st.line())),  # FLOAT
    0x47: _push(lambda st: _F64.unpack(st.take(8))[0]),  # BINFLOAT
    0x8C: _text(1),  # SHORT_BINUNICODE
    0x8D: _text(8),  # BINUNICODE8
    0x42: _raw(4, False),  # BINBYTES (a signed length, as BINSTRING's)
    0x43: _raw(1, False),  # SHORT_BINBYTES
    0x8E: _raw(8, False),  # BINBYTES8
    0x54: _raw(4, True),  # BINSTRING
    0x55: _raw(1, True),  # SHORT_BINSTRING
    0x61: lambda st: _extend(st.stack[-2], [st.stack.pop()]),  # APPEND
    0x6C: lambda st: _push_marked(st, list),  # LIST
    0x29: _tuple(0),
    0x85: _tuple(1),
    0x86: _tuple(2),
    0x87: _tuple(3),
    0x74: lambda st: _push_marked(st, tuple),  # TUPLE
    0x64: _dict,
    0x73: _setitem,
    0x67: lambda st: _get(st, int(st.line())),  # GET
    0x6A: lambda st: _get(st, _U32.unpack(st.take(4))[0]),  # LONG_BINGET
    0x70: lambda st: _put(st, int(st.line())),  # PUT
    0x72: lambda st: _put(st, _U32.unpack(st.take(4))[0]),  # LONG_BINPUT
    0x94: lambda st: _put(st, len(st.memo)),  # MEMOIZE
    0x63: _refuse_global,
    0x93: _refuse_stack_global,
}


def _load(data: bytes) -> object:
    """The pickle's value. The common opcodes of torch's dumps are handled here, inline (a
    dump is millions of them); the others by ``_RARE``; any opcode not in either (every one
    that builds an object, sets, LONG4, out-of-band buffers, protocol 0 text) is refused."""
    st = _State(data)
    stack, meta, memo = st.stack, st.meta, st.memo
    i = 0
    while True:
        op = data[i]
        i += 1
        if op == 0x68:  # BINGET
            stack.append(memo[data[i]])
            i += 1
        elif op == 0x58:  # BINUNICODE
            end = i + 4 + _U32.unpack_from(data, i)[0]
            if end > len(data):
                raise _Refused("cut short: a string runs past the end")
            stack.append(str(data[i + 4 : end], "utf-8", "surrogatepass"))
            i = end
        elif op == 0x71:  # BINPUT
            memo[data[i]] = stack[-1]
            i += 1
        elif op == 0x28:  # MARK
            meta.append(stack)
            stack = []
        elif op == 0x4B:  # BININT1
            stack.append(data[i])
            i += 1
        elif op == 0x72:  # LONG_BINPUT (past 256 memo entries)
            memo[_U32.unpack_from(data, i)[0]] = stack[-1]
            i += 4
        elif op == 0x6A:  # LONG_BINGET
            stack.append(memo[_U32.unpack_from(data, i)[0]])
            i += 4
        elif op == 0x5D:  # EMPTY_LIST
            stack.append([])
        elif op == 0x7D:  # EMPTY_DICT
            stack.append({})
        elif op == 0x65:  # APPENDS
            items, stack = stack, meta.pop()
            _extend(stack[-1], items)
        elif op == 0x75:  # SETITEMS
            items, stack = stack, meta.pop()
            _set_items(stack[-1], items)
        elif op == 0x2E:  # STOP
            return stack[-1]
        else:
            handler = _RARE.get(op)
            if handler is None:
                name = _NAMES.get(op)
                raise _Refused(
                    f"refused opcode {name}: a dump holds data only"
                    if name
                    else f"unknown opcode 0x{op:02x}"
                )
            st.i, st.stack = i, stack
            handler(st)
            i, stack = st.i, st.stack


def decode_pickle(data: bytes) -> object:
    """The pickle's value; ``ValueError`` (one line) for anything but plain data."""
    try:
        return _load(data)
    except _Refused as exc:
        raise ValueError(str(exc)) from None
    except IndexError:
        raise ValueError("cut short: no STOP opcode, or an empty stack") from None
    except KeyError as exc:
        raise ValueError(
            f"corrupt: memo entry {_first_line(exc)} read before it was stored"
        ) from None
    except (ValueError, TypeError, AttributeError, OverflowError, struct.error) as exc:
        raise ValueError(f"corrupt ({type(exc).__name__}: {_first_line(exc)})") from None


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
