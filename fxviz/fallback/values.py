"""Non-tensor call arguments as IR attrs: readable for renderers, exact for replay.

A node's ``attrs`` show each non-tensor argument the way every capture method shows it
(:func:`fxviz.torchbridge.values.json_safe`: ``torch.float32`` -> ``"float32"``, a slice -> ``"1:3"``).
That rendering loses what replay needs: a tuple index is not a list index, ``"float32"`` is not a
dtype. So an argument whose display is lossy also gets an exact, still JSON-safe, encoding under
``attrs["py"][name]``::

    x[:, 0]  ->  attrs == {"arg1": [":", 0], "py": {"arg1": {"tuple": [{"slice": [None, None, None]}, 0]}}}

Tensors nested inside an argument (``torch.cat([a, b])``) are inputs of the node, in argument order;
the display shows ``"%a"``, the exact encoding ``{"tensor": "a"}``. Only arguments that are not exact
as displayed pay for the second encoding.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from fxviz.ir import Ref
from fxviz.torchbridge.values import json_safe

#: attrs keys that describe the call rather than pass an argument to it.
RESERVED = frozenset({"py", "aliases", "data_dependent", "returns_input", "torch_fn"})

_PLAIN = (type(None), bool, int, str)
_PLAIN_TYPES = frozenset({int, bool, str, type(None)})
#: tuples whose plain items are shown and kept as they are (``x.view(x.size())``'s ``torch.Size`` too)
_TUPLES = frozenset({tuple, torch.Size})


def encode(v: Any, read: Callable[[torch.Tensor], Ref]) -> tuple[Any, Any]:
    """``(display, exact)`` for one argument; ``exact is None`` when the display is exact.

    ``read`` turns a tensor met inside the argument into the reference it adds to the node's inputs.
    """
    if isinstance(v, _PLAIN):
        return v, None
    if isinstance(v, float):
        return (v, None) if math.isfinite(v) else (str(v), {"float": str(v)})
    if isinstance(v, torch.Tensor):
        name = read(v).node
        return f"%{name}", {"tensor": name}
    if type(v) in _TUPLES and all(type(x) in _PLAIN_TYPES for x in v):
        items = list(v)  # shapes, dims, strides: the common case, on every op's path
        return items, {"tuple": items}
    if isinstance(v, (list, tuple)):
        pairs = [encode(x, read) for x in v]
        display = [d for d, _ in pairs]
        if type(v) is list and all(e is None for _, e in pairs):
            return display, None
        items = [d if e is None else e for d, e in pairs]
        return display, ({"list": items} if isinstance(v, list) else {"tuple": items})
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        pairs_d = {k: encode(x, read) for k, x in v.items()}
        return {k: d for k, (d, _) in pairs_d.items()}, {
            "dict": {k: d if e is None else e for k, (d, e) in pairs_d.items()}
        }
    display = json_safe(v)
    if isinstance(v, slice):
        parts = [encode(p, read) for p in (v.start, v.stop, v.step)]
        return display, {"slice": [d if e is None else e for d, e in parts]}
    if v is Ellipsis:
        return display, {"ellipsis": True}
    if isinstance(v, complex):
        return display, {"complex": [v.real, v.imag]}
    for kind in (torch.dtype, torch.device, torch.memory_format, torch.layout):
        if isinstance(v, kind):
            return display, {kind.__name__: str(v).removeprefix("torch.")}
    return display, {"opaque": type(v).__name__}


def has_opaque(exact: Any) -> bool:
    """True when an exact encoding holds a value replay cannot rebuild (a callable, a generator)."""
    if isinstance(exact, dict):
        return "opaque" in exact or any(has_opaque(x) for x in exact.values() if isinstance(x, _NESTED))
    if isinstance(exact, list):  # mostly plain items (a shape): only nested ones are looked into
        return any(has_opaque(x) for x in exact if isinstance(x, _NESTED))
    return False


_NESTED = (dict, list)


def decode(exact: Any, take: Callable[[], Any]) -> Any:
    """Rebuild a value from :func:`encode`'s exact form; ``take()`` yields the next tensor input."""
    if not isinstance(exact, dict):
        return exact
    if len(exact) != 1:
        raise ValueError(f"not an exact argument encoding: {exact!r}")
    (kind, v), = exact.items()
    if kind == "tensor":
        return take()
    if kind == "list":
        return [decode(x, take) for x in v]
    if kind == "tuple":
        return tuple(decode(x, take) for x in v)
    if kind == "dict":
        return {k: decode(x, take) for k, x in v.items()}
    if kind == "slice":
        return slice(*(decode(x, take) for x in v))
    if kind == "ellipsis":
        return Ellipsis
    if kind == "float":
        return float(v)
    if kind == "complex":
        return complex(v[0], v[1])
    if kind == "dtype":
        return getattr(torch, v)
    if kind == "device":
        return torch.device(v)
    if kind in ("memory_format", "layout"):
        return getattr(torch, v)
    raise ValueError(f"cannot rebuild an argument of type {v!r}")
