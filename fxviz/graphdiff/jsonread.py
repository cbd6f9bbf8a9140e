"""Reading a saved diff: small checked readers whose every error is a
:class:`~fxviz.errors.GraphFormatError` naming the field (``differences[2].stack[0]``) and what
was expected. :mod:`fxviz.graphdiff.result` builds its ``from_dict`` methods on them. No torch.
"""

from __future__ import annotations

from typing import Any

from fxviz.calls import Stack
from fxviz.errors import GraphFormatError
from fxviz.ir import Graph, SourceLoc
from fxviz.schema import source as checked_source

_MISSING: Any = object()


def short_repr(v: Any) -> str:
    """``repr(v)``, cut to fit in a one-line message."""
    text = repr(v)
    return text if len(text) <= 60 else text[:59] + "…"


def bad(where: str, expected: str, v: Any) -> GraphFormatError:
    return GraphFormatError(f"diff JSON: {where} must be {expected}, got {short_repr(v)}")


def read_object(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise bad(where, "an object", v)
    return v


def read_field(d: dict[str, Any], key: str, typ: type | tuple[type, ...], where: str, default: Any = _MISSING) -> Any:
    """``d[key]``, of type ``typ`` (a bool is not a number here); ``default`` when it is missing,
    an error when there is none. ``where`` names ``d`` in messages (``""``: the top level)."""
    at = f"{where}.{key}" if where else key
    if key not in d:
        if default is _MISSING:
            raise GraphFormatError(f"diff JSON: {at} is missing")
        return default
    v = d[key]
    if not isinstance(v, typ) or (isinstance(v, bool) and typ is not bool):
        types = typ if isinstance(typ, tuple) else (typ,)
        raise bad(at, "of type " + " or ".join(t.__name__ for t in types), v)
    return v


def read_count(d: dict[str, Any], key: str, where: str) -> int:
    n: int = read_field(d, key, int, where, 0)
    if n < 0:
        raise bad(f"{where}.{key}", "a count", n)
    return n


def read_names(v: Any, where: str) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise bad(where, "a list of strings", v)
    return tuple(v)


def read_stack(v: Any, where: str) -> Stack:
    """A module call stack, written as ``[[module path, call index], ...]``."""
    if not isinstance(v, list):
        raise bad(where, "a list of [module path, call index] pairs", v)
    out = []
    for k, level in enumerate(v):
        if not (isinstance(level, list) and len(level) == 2 and isinstance(level[0], str)
                and isinstance(level[1], int) and not isinstance(level[1], bool) and level[1] >= 0):
            raise bad(f"{where}[{k}]", "a [module path, call index] pair", level)
        out.append((level[0], level[1]))
    return tuple(out)


def read_source(v: Any, where: str) -> SourceLoc | None:
    d = checked_source(v, f"diff JSON: {where}")
    return SourceLoc(**d) if d is not None else None


def read_graph(v: Any, where: str) -> Graph:
    """A graph ``Graph.to_dict`` wrote, checked (:meth:`~fxviz.ir.Graph.validate`)."""
    try:
        g = Graph.from_dict(read_object(v, where))
        g.validate()
    except GraphFormatError as e:
        raise GraphFormatError(f"diff JSON: {where}: {e}") from e
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise GraphFormatError(
            f"diff JSON: {where} is not a graph fxviz wrote ({type(e).__name__}: {str(e)[:80]})"
        ) from e
    return g


__all__ = [
    "bad", "read_count", "read_field", "read_graph", "read_names", "read_object", "read_source", "read_stack",
    "short_repr",
]
