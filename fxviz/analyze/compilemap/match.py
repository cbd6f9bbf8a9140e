"""Which compiled graph ran each op of the eager graph. No torch.

The eager tracer and Dynamo see the same forward on the same inputs, so their ops come in the same
order. Dynamo's graphs are laid end to end in the order they *ran* (a graph that runs three times
is laid three times), and each of their ops is matched to the next eager op, from where the last
match stopped, with the same name (:func:`fxviz.ops.op_name`: ``torch._C._nn.linear`` and
``torch.nn.functional.linear`` are both ``linear``) and the same user source line, in the same
module when Dynamo names one (``nn_module_stack``, up to list indices: a graph compiled for
``blocks.0``'s own ``forward`` is reused for ``blocks.1`` with its first paths; an empty path, an op
of the compiled function's own ``self``, matches any module). A match is looked for
within ``WINDOW`` eager ops, so an op Dynamo made that the tracer never saw cannot pull the cursor
far ahead.

Then the ops Dynamo folded away (``x.size(0)`` becomes a constant, ``dropout`` in eval a no-op)
are filled in: an unmatched op whose nearest matched neighbours on both sides belong to the same
run of the same graph was inside that graph (a graph runs whole: nothing runs eagerly inside it);
before the first and after the last matched op only tensor-metadata ops (``size``, ``dim``,
``shape``) are filled in. Everything else ran eagerly.

Limits: the forward must take the same path in both runs (no randomness in control flow); an op
whose source line Dynamo attributes elsewhere (a ``torch`` function implemented in Python is seen
inside it: the innermost frame outside torch is used, as the tracer does) can stay unmatched; ops
on one line with one name in one module are told apart by order only.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Sequence
from typing import Protocol

from fxviz.ir import Node
from fxviz.ops import TENSOR_META_ATTRS, TENSOR_META_METHODS, op_name, short_name

#: How far ahead (in eager ops) a Dynamo op may find its match.
WINDOW = 400

#: Eager-only ops that may be filled in at the ends of a run: metadata reads Dynamo folds.
_FOLDED = frozenset(TENSOR_META_ATTRS) | frozenset(TENSOR_META_METHODS)


class DynamoOp(Protocol):
    name: str
    module: str
    file: str
    line: int


Run = tuple[str, Sequence[DynamoOp]]  # (graph id, its ops): one run of one compiled graph


def op_key(n: Node) -> tuple[str, int, str]:
    """What an eager op and a Dynamo op must share to match: ``(file, line, op name)``."""
    src = n.source
    return (src.file, src.line, op_name(n.target)) if src is not None else ("", 0, op_name(n.target))


def assign(ops: Sequence[Node], runs: Sequence[Run]) -> dict[str, tuple[str, int]]:
    """Node name -> (graph id, run number) for the eager ``ops`` a compiled graph ran; ops left
    out ran eagerly."""
    hit: list[tuple[str, int] | None] = [None] * len(ops)
    for r, ((gid, _), row) in enumerate(zip(runs, pair(ops, runs), strict=True)):
        for i in row:
            if i is not None:
                hit[i] = (gid, r)
    _fill(ops, hit)
    return {ops[i].name: h for i, h in enumerate(hit) if h is not None}


def pair(ops: Sequence[Node], runs: Sequence[Run], *, start: int = 0) -> list[list[int | None]]:
    """For each run, for each of its Dynamo ops in order, the index in ``ops`` of the eager op it
    is (``None``: none found), looking from ``ops[start]`` on: the op-for-op matching
    :func:`assign` is built on, which numerics use to compare a compiled graph's values with the
    eager ones."""
    by_key: dict[tuple[str, int, str], list[int]] = {}
    for i, n in enumerate(ops):
        by_key.setdefault(op_key(n), []).append(i)
    taken = [False] * len(ops)
    cursor = start
    out: list[list[int | None]] = []
    for _, dops in runs:
        row: list[int | None] = []
        for d in dops:
            found = None
            cands = by_key.get((d.file, d.line, d.name))
            if cands:
                j = bisect_left(cands, cursor)
                while j < len(cands) and cands[j] < cursor + WINDOW:
                    i = cands[j]
                    if not taken[i] and (not d.module or _same_module(ops[i].module, d.module)):
                        taken[i], found, cursor = True, i, i + 1
                        break
                    j += 1
            row.append(found)
        out.append(row)
    return out


_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)")


def _same_module(eager: str, dynamo: str) -> bool:
    """Paths equal up to the indices of list entries: a graph compiled for ``blocks.0``'s own
    ``forward`` runs again for ``blocks.1`` and keeps the paths of its first compile."""
    return eager == dynamo or _INDEX.sub("#", eager) == _INDEX.sub("#", dynamo)


def _fill(ops: Sequence[Node], hit: list[tuple[str, int] | None]) -> None:
    matched = [i for i, h in enumerate(hit) if h is not None]
    if not matched:
        return
    first, last = matched[0], matched[-1]
    for i in range(first):
        if _folded(ops[i]):
            hit[i] = hit[first]
    for i in range(last + 1, len(ops)):
        if _folded(ops[i]):
            hit[i] = hit[last]
    for a, b in zip(matched, matched[1:], strict=False):
        if b > a + 1 and hit[a] == hit[b]:
            for i in range(a + 1, b):
                hit[i] = hit[a]


def _folded(n: Node) -> bool:
    return (short_name(n.target) in _FOLDED or op_name(n.target) in _FOLDED) and not n.attrs.get("data_dependent")


__all__ = ["WINDOW", "DynamoOp", "Run", "assign", "op_key", "pair"]
