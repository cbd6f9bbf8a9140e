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

:func:`consistent` then drops a pair the data flow contradicts: where a line runs more often on
one side (transformers builds a Gemma2's masks from ``and_masks(causal, padding)`` under Dynamo and
``export`` but skips the padding part eagerly), order pairs the full mask's ``&`` with the sliding
one's, and 10 of its 64 booleans "differed" from a value that was never its counterpart. A pair
whose op reads a value paired with an eager value its eager op does not read (or the other way
round) is not the same value: it is not compared, rather than compared wrongly. Ops only the other
side ran (no eager op is paired with them: the ``&`` of ``and_masks`` with a mask of ones) are
looked through: the full mask's ``expand`` reads the causal ``le`` through them, as eager's does
directly.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping, Sequence

from fxviz.ir import Graph, Node
from fxviz.ops import op_family, short_name

#: How many ops upstream the parameters and buffers an op reads are looked for.
DEPTH = 8


#: Ops whose result is their input seen another way (views, conversions a float32 run may drop) or
#: their input written in place: a reader on one side may read the op, on the other what it read
#: (Dynamo's graph reads a tensor's first node after ``x.mul_(2)``, eager's tracer the write).
_CONVERSIONS = frozenset({"float", "double", "half", "bfloat16", "int", "long", "bool", "type", "cpu", "cuda",
                          "data", "setitem", "__setitem__", "lift_fresh_copy"})

#: The operator module's names that end in ``_`` without writing anything (``x & y`` is ``operator.and_``).
_OPERATORS = frozenset({"and_", "or_", "not_", "is_", "is_not_", "inv_"})


def passes_through(name: str) -> bool:
    """Whether op ``name`` (a target, ``Tensor.mul_``, ``operator.iadd``, ``aten.view.default``)
    hands on its input's value as a view, a conversion or an in-place write."""
    short = short_name(name)
    if short.startswith("__i") and short.endswith("__") or short in ("iadd", "isub", "imul", "itruediv", "iand", "ior"):
        return True
    if short.endswith("_") and not short.endswith("__") and short not in _OPERATORS:
        return True
    return short in _CONVERSIONS or op_family(name) == "shape"


class Reads:
    """What each op of a graph reads: ``ops[j]`` the indices of the ops it reads, ``anchors[j]``
    the paths of the parameters and buffers it reads directly; ``through[j]``: op ``j`` hands on its
    input's value (:func:`passes_through`)."""

    def __init__(self, ops: Sequence[Sequence[int]], anchors: Sequence[frozenset[str]],
                 through: Sequence[bool] | None = None) -> None:
        self.ops, self.anchors = ops, anchors
        self.through = list(through) if through is not None else [False] * len(ops)
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
        return cls(reads, anchors, [isinstance(n.target, str) and passes_through(n.target) for n in ops])

    def roots(self, js: Sequence[int], loose: Collection[int] = ()) -> set[int]:
        """``js`` and what they hand on (back through ops that pass their input through, and through
        the ops in ``loose``), up to :data:`DEPTH` steps (four times as many through ``loose``: a
        decomposed layer norm is a dozen ATen ops)."""
        seen, frontier = set(js), list(js)
        for _ in range(DEPTH * (4 if loose else 1)):
            nxt = [r for f in frontier if self.through[f] or f in loose for r in self.ops[f] if r not in seen]
            seen.update(nxt)
            frontier = nxt
        return seen

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
    docstring); ``keys`` and ``modules``: each Dynamo op's (file, line, name) and module path. The
    ops are taken in the graph's order, so the ops a Dynamo op reads are settled before it: first
    the candidate that reads what they were paired with (Gemma2's ``repeat_kv`` of the key and of
    the value: one line, the same weights eight ops up), then the module, then the weights."""
    out = list(row)
    groups: dict[tuple[str, int, str], list[int]] = {}
    for j, e in enumerate(row):
        if e is not None:
            groups.setdefault(keys[j], []).append(j)
    free = {k: sorted(e for j in members if (e := row[j]) is not None)
            for k, members in groups.items() if len(members) > 1}
    for j in sorted(j for k in free for j in groups[k]):
        mine = dynamo.upstream(j)
        cands = free[keys[j]]
        best = max(cands, key=lambda e: (_agrees(j, e, out, dynamo, eager),
                                         bool(modules[j]) and eager_ops[e].module == modules[j],
                                         len(mine & eager.upstream(e)), -e))
        out[j] = best
        cands.remove(best)
    return out


def _agrees(x: int, e: int, pairs: Sequence[int | None] | Mapping[int, int], other: Reads, eager: Reads) -> int:
    """How many of the ops ``x`` reads are paired with what eager op ``e`` reads, less those paired
    with something else (through views, conversions and in-place writes on either side)."""
    mine = eager.roots(eager.ops[e])
    score = 0
    for xi in other.ops[x]:
        ei = pairs.get(xi) if isinstance(pairs, Mapping) else pairs[xi]
        if ei is None:
            continue
        score += 1 if ei in mine or eager.roots([ei]) & mine else -1
    return score


def consistent(pairs: Mapping[int, int], eager: Reads, other: Reads, ambiguous: Collection[int],
               loose: Collection[int] = (), *, settled: bool = True,
               keys: tuple[Sequence[Hashable], Sequence[Hashable]] | None = None) -> dict[int, int]:
    """``pairs`` (other op -> eager op) less those the data flow contradicts (see the module's
    docstring), taken in the other side's order: other op ``x`` paired with eager op ``e`` reads an
    op paired with an eager value that ``e`` does not read (through views, conversions and in-place
    writes on either side), or one found not to be what ``e`` reads; or ``e`` reads a value paired
    with one ``x`` does not read. Only pairs whose eager op is in ``ambiguous`` (its source line and
    op name are another eager op's too: where order can pick the wrong one) are checked. ``settled``
    (:func:`refine` made the pairs in order from what each op reads): the evidence is the pairs
    kept so far; else the pairs as made, each taken as it is (one dropped upstream must not hide
    the contradiction below it; a pair wrong upstream would drop everything below it).
    ``loose``: other ops paired as the last of a decomposition, whose inputs are found through
    the unpaired ops before them. ``keys`` (each other op's and each eager op's (file, line, name)):
    where ``x`` reads, instead of ``ei``'s pair, an unpaired op of ``ei``'s key, that op is ``ei``
    (and so on up what they read: :func:`_repair`); a Gemma2's layer reads the sliding mask that
    Dynamo built after the full one, which order paired with eager's sliding mask."""
    out = dict(pairs)
    alone = {j for j in range(len(other.ops)) if j not in pairs}  # ops eager never ran
    unpaired = alone if loose else set()
    back = {e: x for x, e in pairs.items()}
    for x, e in sorted(pairs.items()):
        if e not in ambiguous or out.get(x) != e:
            continue
        mine = eager.roots(eager.ops[e])
        theirs = other.roots(other.ops[x], unpaired if x in loose else ())
        evidence = out if settled else pairs
        wrong = _agrees(x, e, evidence, other, eager) < sum(1 for xi in other.ops[x] if xi in evidence) or \
            (settled and any(xi not in out and pairs[xi] in mine for xi in other.ops[x] if xi in pairs))
        for ei in eager.ops[e]:
            xi = back.get(ei)
            if xi is not None and (not settled or xi in out) and xi not in theirs and \
                    not other.roots([xi]) & theirs and xi not in other.roots(other.ops[x], alone) and \
                    (keys is None or not _repair(x, ei, out, back, other, eager, keys)):
                wrong = True
        if wrong:
            del out[x]
            if settled and back.get(e) == x:
                del back[e]
    return out


def _repair(x: int, ei: int, out: dict[int, int], back: dict[int, int], other: Reads, eager: Reads,
            keys: tuple[Sequence[Hashable], Sequence[Hashable]], depth: int = DEPTH) -> bool:
    """Pair eager op ``ei`` with the one op ``x`` reads, unpaired, of ``ei``'s key, in place of its
    pair, and the ops that one reads with ``ei``'s inputs the same way; whether there was one."""
    mine = [xj for xj in other.ops[x] if xj not in out and keys[0][xj] == keys[1][ei]]
    if len(mine) != 1 or depth == 0:
        return False
    xj = mine[0]
    old = back.get(ei)
    if old is not None:
        out.pop(old, None)
    out[xj], back[ei] = ei, xj
    for ej in eager.ops[ei]:
        xk = back.get(ej)
        if xk is not None and xk not in other.ops[xj]:
            _repair(xj, ej, out, back, other, eager, keys, depth - 1)
    return True


def ambiguous_ops(keys: Sequence[tuple[str, int, str]]) -> set[int]:
    """The indices whose key (source file, line, op name) another index shares."""
    count: dict[tuple[str, int, str], int] = {}
    for k in keys:
        count[k] = count.get(k, 0) + 1
    return {i for i, k in enumerate(keys) if count[k] > 1}


def _path(n: Node) -> str:
    return n.target if isinstance(n.target, str) and n.target else n.name


def anchors_of(names: Mapping[int, str], ids: Sequence[int | None]) -> frozenset[str]:
    """The paths of the tensors ``ids`` (``id()`` of each) that are parameters or buffers (``names``)."""
    return frozenset(names[i] for i in ids if i is not None and i in names)


__all__ = ["DEPTH", "Reads", "ambiguous_ops", "anchors_of", "consistent", "passes_through", "refine"]
