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
#: the types of the items of a tuple shown and kept as it is (:data:`TUPLES`)
PLAIN_ITEMS = frozenset({int, bool, str, type(None)})
#: tuples whose plain items are shown and kept as they are (``x.view(x.size())``'s ``torch.Size`` too):
#: ``(items, {"tuple": items})``, which the recorder makes inline for a call's shape argument
TUPLES = frozenset({tuple, torch.Size})
#: values replay rebuilds from their text, by type: ``(display, kind, text)`` per value met (a few
#: dtypes and devices per model) in :data:`_ATOMS`
_ATOM_TYPES = (torch.dtype, torch.device, torch.memory_format, torch.layout)
_ATOMS: dict[Any, tuple[Any, str, str]] = {}


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
    if type(v) in TUPLES:
        for x in v:  # a loop, not all() over a generator: shapes, dims, strides, on every op's path
            if type(x) not in PLAIN_ITEMS:
                break
        else:
            items = list(v)
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
    kind = type(v)
    if kind in _ATOM_TYPES:  # a dtype, a device: worked out once per value (``torch.tensor(..., dtype=)``)
        hit = _ATOMS.get(v)
        if hit is None:
            hit = _ATOMS[v] = (json_safe(v), kind.__name__, str(v).removeprefix("torch."))
        return hit[0], {hit[1]: hit[2]}
    display = json_safe(v)
    if isinstance(v, slice):
        parts = [encode(p, read) for p in (v.start, v.stop, v.step)]
        return display, {"slice": [d if e is None else e for d, e in parts]}
    if v is Ellipsis:
        return display, {"ellipsis": True}
    if isinstance(v, complex):
        return display, {"complex": [v.real, v.imag]}
    for atom in _ATOM_TYPES:
        if isinstance(v, atom):
            return display, {atom.__name__: str(v).removeprefix("torch.")}
    return display, {"opaque": type(v).__name__}


def has_opaque(exact: Any) -> bool:
    """True when an exact encoding holds a value replay cannot rebuild (a callable, a generator)."""
    # loops, not any() over generators: this runs for most calls with a non-scalar argument
    if isinstance(exact, dict):
        if "opaque" in exact:
            return True
        items: Any = exact.values()
    elif isinstance(exact, list):  # mostly plain items (a shape): only nested ones are looked into
        items = exact
    else:
        return False
    for x in items:  # noqa: SIM110 - a loop: any() over a generator costs a frame per item
        if isinstance(x, _NESTED) and has_opaque(x):
            return True
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
