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


def _key(n: Node) -> tuple[str, int, str]:
    src = n.source
    return (src.file, src.line, op_name(n.target)) if src is not None else ("", 0, op_name(n.target))


def assign(ops: Sequence[Node], runs: Sequence[Run]) -> dict[str, tuple[str, int]]:
    """Node name -> (graph id, run number) for the eager ``ops`` a compiled graph ran; ops left
    out ran eagerly."""
    by_key: dict[tuple[str, int, str], list[int]] = {}
    for i, n in enumerate(ops):
        by_key.setdefault(_key(n), []).append(i)
    hit: list[tuple[str, int] | None] = [None] * len(ops)
    cursor = 0
    for r, (gid, dops) in enumerate(runs):
        for d in dops:
            cands = by_key.get((d.file, d.line, d.name))
            if not cands:
                continue
            j = bisect_left(cands, cursor)
            while j < len(cands) and cands[j] < cursor + WINDOW:
                i = cands[j]
                if hit[i] is None and (not d.module or _same_module(ops[i].module, d.module)):
                    hit[i] = (gid, r)
                    cursor = i + 1
                    break
                j += 1
    _fill(ops, hit)
    return {ops[i].name: h for i, h in enumerate(hit) if h is not None}


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


__all__ = ["WINDOW", "DynamoOp", "Run", "assign"]
