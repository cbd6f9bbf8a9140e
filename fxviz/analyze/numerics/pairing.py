"""Which eager op each Dynamo op of a graph call is, told apart by what it reads, not by when it ran.

compilemap's :func:`~fxviz.analyze.compilemap.match.pair` pairs Dynamo ops with eager ops of the
same (file, line, op name) in order of occurrence: enough to say which graph ran an op, not which
value is which. Where the two runs take the same code in another order, order pairs the wrong
values: ``for t in set(layer_types)`` iterates a set of strings in the order of their hashes
(``PYTHONHASHSEED``) under CPython and in insertion order under Dynamo, so a ModernBERT's rotary
embedding of the full-attention layers is computed first on one side and second on the other, and
the cos of one was compared with the cos of the other in half of all runs.

:func:`refine` keeps the set of eager ops that order paired with the ops of one key in one call,
and reassigns them among those ops by what each reads: the parameters and buffers within
``DEPTH`` ops upstream (the rotary ``cos`` of full attention reads ``full_attention_inv_freq`` two
ops up, the other reads ``sliding_attention_inv_freq``), after its module path exactly (``layers.3``
rather than any ``layers.#``, where Dynamo names it). Where nothing tells the candidates apart, order decides, as before:
ops that read the same things compute the same value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fxviz.ir import Graph, Node

#: How many ops upstream the parameters and buffers an op reads are looked for.
DEPTH = 8


class Reads:
    """What each op of a graph reads: ``ops[j]`` the indices of the ops it reads, ``anchors[j]``
    the paths of the parameters and buffers it reads directly."""

    def __init__(self, ops: Sequence[Sequence[int]], anchors: Sequence[frozenset[str]]) -> None:
        self.ops, self.anchors = ops, anchors
        self._cache: dict[int, frozenset[str]] = {}

    @classmethod
    def of_eager(cls, graph: Graph) -> Reads:
        ops = graph.ops
        index = {n.name: i for i, n in enumerate(ops)}
        kind = {n.name: n for n in graph.nodes}
        reads, anchors = [], []
        for n in ops:
            reads.append([index[r.node] for r in n.inputs if r.node in index])
            anchors.append(frozenset(_path(kind[r.node]) for r in n.inputs
                                     if r.node in kind and kind[r.node].kind in ("parameter", "buffer")))
        return cls(reads, anchors)

    def upstream(self, j: int) -> frozenset[str]:
        """The parameters and buffers read within :data:`DEPTH` ops of op ``j`` (itself included)."""
        found = self._cache.get(j)
        if found is not None:
            return found
        acc: set[str] = set(self.anchors[j])
        seen, frontier = {j}, [j]
        for _ in range(DEPTH):
            nxt = []
            for f in frontier:
                for r in self.ops[f]:
                    if r not in seen:
                        seen.add(r)
                        nxt.append(r)
                        acc |= self.anchors[r]
            frontier = nxt
        out = self._cache[j] = frozenset(acc)
        return out


def refine(row: Sequence[int | None], keys: Sequence[tuple[str, int, str]], modules: Sequence[str],
           dynamo: Reads, eager_ops: Sequence[Node], eager: Reads) -> list[int | None]:
    """``row`` (per Dynamo op of one graph call, the index of its eager op or ``None``) with the
    eager ops of each key reassigned among that key's Dynamo ops by what they read (see the module's
    docstring); ``keys`` and ``modules``: each Dynamo op's (file, line, name) and module path."""
    out = list(row)
    groups: dict[tuple[str, int, str], list[int]] = {}
    for j, e in enumerate(row):
        if e is not None:
            groups.setdefault(keys[j], []).append(j)
    for members in groups.values():
        if len(members) < 2:
            continue
        free = sorted(e for j in members if (e := row[j]) is not None)
        for j in members:
            mine = dynamo.upstream(j)
            best = max(free, key=lambda e: (bool(modules[j]) and eager_ops[e].module == modules[j],
                                            len(mine & eager.upstream(e)), -e))
            out[j] = best
            free.remove(best)
    return out


def _path(n: Node) -> str:
    return n.target if isinstance(n.target, str) and n.target else n.name


def anchors_of(names: Mapping[int, str], ids: Sequence[int | None]) -> frozenset[str]:
    """The paths of the tensors ``ids`` (``id()`` of each) that are parameters or buffers (``names``)."""
    return frozenset(names[i] for i in ids if i is not None and i in names)


__all__ = ["DEPTH", "Reads", "anchors_of", "refine"]
