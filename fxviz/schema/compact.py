"""Long strings written once: how schema 2 keeps a deeply nested model's JSON linear in its size.

A model nested ``d`` deep names its parameters ``inner.inner. ... .lin.weight`` (``O(d)``
characters each), fx names its ops after the module path, and the module table lists every path:
written in full, the JSON grew with ``d`` squared (158 MB at a depth of 2,000). Schema 2 writes
such a string as ``[j, k, suffix]``: the first ``k`` characters of the ``j``-th earlier string of
the same table (node names, module paths, call levels), then ``suffix``; a parameter's target is
``[k, suffix]`` after its own name; a reference to a node with a long name is the node's index.
Short strings are written as they are, so small graphs read as before. No IR, no torch.

The reader caps the characters these forms expand to (:data:`MAX_EXPANDED`): a few bytes must not
make gigabytes of names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fxviz.errors import GraphFormatError
from fxviz.schema.values import _fail, _item, _text

#: A shared prefix shorter than this is written out (the list costs about as much).
MIN_SHARED = 16
#: Characters that prefix forms may expand to in all, per graph: a model nested 2,000 deep expands
#: to about 60 million; a hostile file of a few bytes per node must not reach gigabytes.
MAX_EXPANDED = 2**28


def _shared(a: str, b: str) -> int:
    """Length of the common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def front(strings: list[str], j: int | None, s: str) -> str | list[Any]:
    """``s`` as ``[j, k, suffix]`` after ``strings[j]`` when they share enough, else ``s``."""
    if j is None or len(s) < MIN_SHARED:
        return s
    k = _shared(strings[j], s)
    return [j, k, s[k:]] if k >= MIN_SHARED else s


def after(prefix: str, s: str) -> str | list[Any]:
    """``s`` as ``[k, suffix]`` after ``prefix`` (a node's own name) when they share enough."""
    k = _shared(prefix, s) if len(s) >= MIN_SHARED else 0
    return [k, s[k:]] if k >= MIN_SHARED else s


class Expander:
    """Reads the forms :func:`front` and :func:`after` write, counting what they expand to."""

    def __init__(self) -> None:
        self.expanded = 0

    def _count(self, s: str) -> str:
        self.expanded += len(s)
        if self.expanded > MAX_EXPANDED:
            raise GraphFormatError(f"graph JSON: its shared prefixes expand to more than {MAX_EXPANDED:,} characters "
                                   "in all, more than any model's names")
        return s

    def front(self, v: Any, strings: list[str], where: Callable[[], str]) -> Any:
        """``v`` expanded when it is ``[j, k, suffix]`` after ``strings[j]``; other values unchanged
        (the caller checks them)."""
        if not isinstance(v, list) or len(v) != 3:
            return v
        j, k, suffix = v
        if type(j) is not int or not 0 <= j < len(strings):
            _fail(f"{where()} [index, length, suffix]", f"an earlier index (0 to {len(strings) - 1})", j)
        return self._prefixed(strings[j], k, suffix, where)

    def after(self, v: Any, prefix: str, where: Callable[[], str]) -> Any:
        """``v`` expanded when it is ``[k, suffix]`` after ``prefix``; other values unchanged."""
        if not isinstance(v, list) or len(v) != 2:
            return v
        return self._prefixed(prefix, v[0], v[1], where)

    def keyed(self, v: Any, where: Callable[[], str]) -> Any:
        """A list of ``[path, value]`` (:func:`keyed`) as an object keyed by the expanded paths;
        anything else unchanged."""
        if not isinstance(v, list):
            return v
        paths: list[str] = []
        out: dict[str, Any] = {}
        for k, entry in enumerate(v):
            if not isinstance(entry, list) or len(entry) != 2:
                _fail(f"{where()}[{k}]", "[module path, value]", entry)
            at = _item(where, "", k, " path")
            path = _text(self.front(entry[0], paths, at), at)
            out[path] = entry[1]
            paths.append(path)
        return out

    def _prefixed(self, prefix: str, k: Any, suffix: Any, where: Callable[[], str]) -> str:
        if type(k) is not int or not 0 <= k <= len(prefix):
            _fail(f"{where()} shared length", f"0 to {len(prefix)}", k)
        if not isinstance(suffix, str):
            _fail(f"{where()} suffix", "a string", suffix)
        return self._count(prefix[:k] + suffix)


def _near(seen: dict[str, int], path: str, fallback: int | None) -> int | None:
    """The index of the nearest of ``path``'s enclosing paths in ``seen`` (a few levels up), else
    ``fallback``."""
    for _ in range(4):
        path, dot, _ = path.rpartition(".")
        if not dot:
            break
        if path in seen:
            return seen[path]
    return fallback


def keyed(table: dict[str, Any]) -> list[list[Any]]:
    """A table keyed by module path as a list of ``[path, value]``, each path after its nearest
    enclosing path in the table (or the one before)."""
    paths = list(table)
    seen: dict[str, int] = {}
    out = []
    for i, (path, value) in enumerate(table.items()):
        out.append([front(paths, _near(seen, path, i - 1 if i else None), path), value])
        seen.setdefault(path, i)
    return out


def _tables(ann: Any, fn: Callable[[Any, str], Any]) -> Any:
    """``ann`` with ``fn(table, where)`` applied to the annotations' tables keyed by module path
    (the ``stats`` annotation's ``modules``, each overlay's ``modules``), copied where they are;
    ``where`` names the table as the reader's errors do."""
    if not isinstance(ann, dict):
        return ann
    out = dict(ann)
    stats = ann.get("stats")
    if isinstance(stats, dict) and "modules" in stats:
        out["stats"] = {**stats, "modules": fn(stats["modules"], "annotation 'stats' 'modules'")}
    overlays = ann.get("overlays")
    if isinstance(overlays, dict):
        out["overlays"] = {k: {**o, "modules": fn(o["modules"], f"annotation 'overlays'[{k!r}] 'modules'")}
                           if isinstance(o, dict) and "modules" in o else o
                           for k, o in overlays.items()}
    return out


def _ref(r: Any, index: dict[str, int]) -> Any:
    name = r if isinstance(r, str) else r[0]
    if len(name) < MIN_SHARED or name not in index:
        return r
    return index[name] if isinstance(r, str) else [index[name], r[1]]


def pack(d: dict[str, Any]) -> dict[str, Any]:
    """Rewrite the plain data of a graph (``Graph.to_dict``'s, long strings written in full) in
    place, each long string after an earlier one: a node's name after the previous node of its
    kind, its target after its name, a reference to a long name as the node's index; the tables
    keyed by module path (``modules``, the ``stats`` annotation's ``modules``) become lists of
    ``[path, value]`` (:func:`keyed`), and an outermost call level in ``stacks`` is written after
    the level of an enclosing module. Returns ``d`` (its annotations are copied where changed)."""
    nodes = d["nodes"]
    names = [n["name"] for n in nodes]
    index = {name: i for i, name in enumerate(names)}
    last: dict[str, int] = {}
    for i, n in enumerate(nodes):
        name = names[i]
        n["name"] = front(names, last.get(n["kind"]), name)
        last[n["kind"]] = i
        if n.get("target"):
            n["target"] = after(name, n["target"])
        if n.get("inputs"):
            n["inputs"] = [_ref(r, index) for r in n["inputs"]]
    d["modules"] = keyed(d["modules"])
    d["annotations"] = _tables(d["annotations"], lambda t, _where: keyed(t) if isinstance(t, dict) else t)
    full: list[str] = []
    seen: dict[str, int] = {}
    outer = None  # the last level written in full
    for k, entry in enumerate(d.get("stacks", ())):
        parent, path = entry[0], entry[1]
        if path.startswith(".") and parent >= 0:
            path = full[parent] + path
        else:
            entry[1] = front(full, _near(seen, path, outer), path)
            outer = k
        full.append(path)
        seen.setdefault(path, k)
    return d
