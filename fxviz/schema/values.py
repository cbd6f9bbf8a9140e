"""The checks every part of a saved graph is made of: messages that name the field, and plain
values (text, integers, finite numbers, objects, arrays, free-form values) checked without
recursion. No torch, no IR."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, NoReturn

from fxviz.errors import GraphFormatError

#: The graph JSON this fxviz writes. 2: node stacks as one table of call levels (``stacks``, each
#: node's ``stack`` an index into it), so a graph nested N modules deep is not N^2 in size; 1:
#: each node wrote its whole stack of module paths. Both are read (:data:`READABLE_SCHEMAS`); an
#: older fxviz meets a 2 with "reads schema 1: re-capture", not a missing key.
SCHEMA_VERSION = 2
READABLE_SCHEMAS: tuple[int, ...] = (1, 2)
#: ``call``: a module call that ran but dispatched no op (an eval-mode ``Dropout`` at ATen level, an
#: ``Identity``); it has no inputs or outputs, only the call's ``stack`` and the module class as target.
NODE_KINDS: tuple[str, ...] = ("input", "parameter", "buffer", "constant", "op", "output", "call")

#: Levels a free-form value (node attrs, unknown annotations) may nest: far beyond what a capture
#: writes, low enough that every writer and the report's script handle it without recursion limits.
MAX_NESTING = 64
#: Module calls one node may sit in. Real models nest tens of levels (a forward nested deeper than a
#: few hundred modules exceeds Python's own recursion limit).
MAX_STACK = 5_000
#: The call tree and the diff keep every prefix of every distinct stack, so a stack ``d`` levels deep
#: costs ``d * (d + 1) / 2`` cells: this caps their sum (one 5,000-level stack is 12.5M).
MAX_STACK_CELLS = 2**25
#: Sizes, indices, counts and line numbers are non-negative and fit in 64 bits.
MAX_INT = 2**63 - 1

_SURROGATE = re.compile(r"[\ud800-\udfff]")


# ---- messages ------------------------------------------------------------------------------------


def show(value: Any, limit: int = 60) -> str:
    """A short, one-line, terminal-safe description of a value found in a file (``repr`` escapes
    control characters; containers are described, never printed, so depth cannot hurt)."""
    if isinstance(value, str):
        text = repr(value[:limit])
        return text + "…" if len(value) > limit else text
    if value is None or isinstance(value, bool | float):
        return repr(value)
    if isinstance(value, int):
        text = str(value) if value.bit_length() < 200 else "a very large integer"
        return text
    if isinstance(value, list | tuple):
        return f"a list of {len(value)} items"
    if isinstance(value, dict):
        return f"an object with {len(value)} keys"
    return f"a {type(value).__name__}"


def _fail(where: str, expected: str, got: Any) -> NoReturn:
    raise GraphFormatError(f"graph JSON: {where}: expected {expected}, got {show(got)}")


Where = Callable[[], str]  # where a value sits, worked out only when a message needs it


def _at(where: Where, suffix: str) -> Where:
    return lambda: where() + suffix


def _item(where: Where, field: str, k: int, note: str = "") -> Where:
    """``where`` of item ``k`` of ``field``, formatted only when a message needs it (hot loops)."""
    return lambda: f"{where()}{field}[{k}]{note}"


def _node_at(i: int, name: Any) -> str:
    return f"node {show(name)} (nodes[{i}])" if isinstance(name, str) else f"nodes[{i}]"


# ---- values --------------------------------------------------------------------------------------


def _text(v: Any, where: Where, *, empty: bool = True) -> str:
    if not isinstance(v, str):
        _fail(where(), "a string", v)
    if not empty and not v:
        _fail(where(), "a non-empty string", v)
    if not v.isascii() and _SURROGATE.search(v):
        raise GraphFormatError(
            f"graph JSON: {where()}: holds a lone surrogate ({show(v)}), which is not a character: "
            "fix the text that made it"
        )
    return v


def _int(v: Any, where: Where) -> int:
    if type(v) is not int or not 0 <= v <= MAX_INT:
        _fail(where(), "a non-negative integer below 2**63", v)
    return v


def _number(v: Any, where: Where) -> float:
    if type(v) is int:
        return float(v) if abs(v) <= MAX_INT else _fail(where(), "a number below 2**63", v)
    if type(v) is not float or not math.isfinite(v):
        _fail(where(), "a finite number", v)
    return v


def _opt_text(d: dict[str, Any], key: str, where: Where, default: str | None = "", *, empty: bool = True) -> Any:
    """Field ``key`` of ``d``: a string, or ``default`` when absent (``None``: may be null)."""
    v = d.get(key, default)
    if type(v) is str and v.isascii() and (empty or v):  # the common case, without a closure
        return v
    if v is None and default is None:
        return None
    return _text(v, lambda: f"{where()} '{key}'", empty=empty)


def _object(v: Any, where: Where) -> dict[str, Any]:
    if not isinstance(v, dict):
        _fail(where(), "an object", v)
    return v


def _array(v: Any, where: Where) -> list[Any] | tuple[Any, ...]:
    if not isinstance(v, list | tuple):
        _fail(where(), "a list", v)
    return v


def check_value(value: Any, where: Where) -> Any:
    """Check a free-form JSON value (node attrs, an annotation fxviz does not know): JSON types
    only (a tuple counts as a list, for graphs built in memory), string keys, finite numbers, no
    lone surrogates, at most :data:`MAX_NESTING` levels. Iterative. Returns ``value``."""
    todo: list[tuple[Any, int]] = [(value, 0)]
    while todo:
        v, depth = todo.pop()
        if v is None or isinstance(v, bool | int):
            continue
        if isinstance(v, str):
            _text(v, where)
        elif isinstance(v, float):
            _number(v, where)
        elif isinstance(v, list | tuple | dict):
            if depth >= MAX_NESTING:
                raise GraphFormatError(f"graph JSON: {where()}: nested more than {MAX_NESTING} levels deep")
            if isinstance(v, dict):
                for k in v:
                    _text(k, lambda: f"{where()} (a key)")
                todo.extend((x, depth + 1) for x in v.values())
            else:
                todo.extend((x, depth + 1) for x in v)
        else:
            _fail(where(), "a JSON value (null, true/false, a number, a string, a list or an object)", v)
    return value


def _source(v: Any, where: Where) -> dict[str, Any] | None:
    """A source location, or None (``null``, absent, or ``{}`` as older files wrote it)."""
    if v is None or v == {}:
        return None
    d = _object(v, where)
    return {
        "file": _text(d.get("file"), lambda: f"{where()} 'file'"),
        "line": _int(d.get("line"), lambda: f"{where()} 'line'"),
        "func": _opt_text(d, "func", where),
        "code": _opt_text(d, "code", where),
    }


def source(v: Any, where: str) -> dict[str, Any] | None:
    """A source location written by ``SourceLoc`` (``{"file", "line", "func", "code"}``) or
    ``None``, checked; for readers of other fxviz JSON (a saved diff)."""
    return _source(v, lambda: where)
