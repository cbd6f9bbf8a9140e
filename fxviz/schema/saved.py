"""The training parts of a saved graph: a node's ``phase`` and the graph's ``saved`` list
(:class:`fxviz.saved.Saved` as plain data). No torch, no IR. Both are optional: a graph saved
before they existed reads as a forward graph with nothing saved."""

from __future__ import annotations

from typing import Any

from fxviz.schema.values import Where, _array, _fail, _int, _item, _object, _opt_text, _text

#: The values a node's ``phase`` takes (``forward`` when absent).
PHASES: tuple[str, ...] = ("forward", "backward", "recompute")
#: Why a saved record costs no memory of its own.
SHARES: tuple[str, ...] = ("", "parameter", "buffer", "input", "view", "freed")


def phase(d: dict[str, Any], where: Where) -> str:
    """A node's ``phase``: one of :data:`PHASES`, ``forward`` when absent."""
    v = d.get("phase", "forward")
    if v not in PHASES:
        _fail(f"{where()} 'phase'", f"one of {', '.join(PHASES)}", v)
    return str(v)


def saved(v: Any, defined: dict[str, int]) -> list[dict[str, Any]]:
    """The graph's ``saved`` list; each record's ``node`` (and ``value``) names a node of the graph."""
    out = []
    for k, r in enumerate(_array(v, lambda: "'saved'")):
        def at(k: int = k) -> str:
            return f"saved[{k}]"

        r = _object(r, at)
        rec: dict[str, Any] = {
            "node": _text(r.get("node"), lambda: f"{at()} 'node'", empty=False),
            "module": _opt_text(r, "module", at),
            "dtype": _text(r.get("dtype"), lambda: f"{at()} 'dtype'", empty=False),
            "bytes": _int(r.get("bytes"), lambda: f"{at()} 'bytes'"),
            "value": _opt_text(r, "value", at),
            "shares": _opt_text(r, "shares", at),
            "inferred": r.get("inferred", False),
            "reason": _opt_text(r, "reason", at),
        }
        shape: list[int | str] = []
        for j, dim in enumerate(_array(r.get("shape", []), lambda: f"{at()} 'shape'")):
            if isinstance(dim, str) and dim:
                shape.append(dim)
            else:
                shape.append(_int(dim, _item(at, " 'shape'", j)))
        rec["shape"] = tuple(shape)
        for key in ("node", "value"):
            if rec[key] and rec[key] not in defined:
                raise_missing(k, key, rec[key])
        if rec["shares"] not in SHARES:
            _fail(f"{at()} 'shares'", f"one of {', '.join(map(repr, SHARES))}", rec["shares"])
        if not isinstance(rec["inferred"], bool):
            _fail(f"{at()} 'inferred'", "true or false", rec["inferred"])
        out.append(rec)
    return out


def raise_missing(k: int, key: str, name: str) -> None:
    _fail(f"saved[{k}] '{key}'", "the name of a node of the graph", name)


__all__ = ["PHASES", "SHARES", "phase", "saved"]
