"""Which compiled graph ran each op of the eager graph. No torch.

The eager tracer and Dynamo see the same forward on the same inputs, so their ops come in the same
order. Dynamo's graphs are laid end to end in the order they *ran* (a graph that runs three times
is laid three times), and each of their ops is matched to the next eager op, from where the last
match stopped, with the same name (:func:`fxviz.ops.op_name`: ``torch._C._nn.linear`` and
``torch.nn.functional.linear`` are both ``linear``) and the same user source line, in the same
module when Dynamo names one (``nn_module_stack``, up to list indices: a graph compiled for
``blocks.0``'s own ``forward`` is reused for ``blocks.1`` with its first paths, and for ``4`` of a
top-level ``nn.Sequential`` with ``0``'s; an empty path, an op of the compiled function's own
``self``, matches any module). A match is looked for within ``WINDOW`` eager ops, so an op Dynamo
made that the tracer never saw cannot pull the cursor far ahead. A match that would skip eager ops
is an alignment decision: it is taken unless more of the next ``LOOKAHEAD`` Dynamo ops can pair
without it, counted exactly as the longest common subsequence of those ops and the free eager ops
under the same predicate (Hunt-Szymanski, on the candidates :func:`pair` already indexes). So ops
that run only compiled (a branch on ``torch.compiler.is_compiling()``; transformers' ``and_masks``,
which builds Gemma2's full mask as ones & causal & packed under Dynamo, only causal eagerly) do not
take a later block's eager ops and leave that block unpaired. Limits: the check sees ``LOOKAHEAD``
Dynamo ops, so a compiled-only block longer than that can still shift what follows; ties keep the
first match (the greedy order), and where no skip is needed nothing changes from a greedy match
(GPT-2, LLaMA, Qwen2 and ModernBERT pair exactly as the greedy match paired them).

The user source line is the innermost user frame on both sides, told by one predicate
(:func:`~fxviz.torchbridge.source.is_user_file`: not torch, not fxviz). But Dynamo's frames begin at
the function it compiled, the tracer's at the model's call: where the compiled function and all it
inlined are library code called from a user's line (a ``torch.nn.Sequential`` a user's module
calls, resumed after a break in one of its children), the Dynamo op has no user line and the eager
op the user's line that called it. A Dynamo op without a user line (``file == ""``) matches by name
and module alone, in order (:func:`matchable` says which eager ops a set of Dynamo ops can match).

A Dynamo op of a name the tracer never recorded, in a named module, stands for a whole call of that
module that the tracer saw as other ops (eval-mode ``nn.TransformerEncoderLayer`` is one fused op
under torch.compile): it takes that call's eager ops if none of them matched; else, inside a call
that other ops of the graph matched, it is a library call whose ops the tracer saw below it
(DTensor's ``from_local``, ``redistribute``: a ``view_as``, an ``all_reduce``) and takes the
module's unmatched eager ops from where the last match stopped up to the next matched op
(:func:`_claim`; for :func:`assign` only, :func:`pair` stays op for op).

Then the ops Dynamo folded away (``x.size(0)`` becomes a constant, ``dropout`` in eval a no-op)
are filled in: an unmatched op whose nearest matched neighbours on both sides belong to the same
run of the same graph was inside that graph (a graph runs whole: nothing runs eagerly inside it);
before the first and after the last matched op only tensor-metadata ops (``size``, ``dim``,
``shape``) are filled in. Everything else ran eagerly.

Limits: the forward must take the same path in both runs (no randomness in control flow); ops on
one line with one name in one module (or, without a user line, of one name in one module) are told
apart by order only.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Collection, Sequence
from typing import Protocol

from fxviz.ir import Node
from fxviz.ops import TENSOR_META_ATTRS, TENSOR_META_METHODS, op_name, short_name

#: How far ahead (in eager ops) a Dynamo op may find its match.
WINDOW = 400

#: How many Dynamo ops after one whose match skips eager ops are aligned both ways to choose (:func:`pair`).
LOOKAHEAD = 32

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


def assign(ops: Sequence[Node], runs: Sequence[Run], *, rows: Sequence[Sequence[int | None]] | None = None,
           filled: set[int] | None = None, claimed: set[tuple[int, int]] | None = None) -> dict[str, tuple[str, int]]:
    """Node name -> (graph id, run number) for the eager ``ops`` a compiled graph ran; ops left
    out ran eagerly. ``rows``: :func:`pair`'s, where the caller has them; ``filled`` gets the
    indices of the eager ops put in a graph with no Dynamo op of their own (claimed or filled in),
    ``claimed`` the (run, op) of each Dynamo op that took a call's eager ops (:func:`_claim`)."""
    hit: list[tuple[str, int] | None] = [None] * len(ops)
    rows = pair(ops, runs) if rows is None else rows
    for r, ((gid, _), row) in enumerate(zip(runs, rows, strict=True)):
        for i in row:
            if i is not None:
                hit[i] = (gid, r)
    _claim(ops, runs, rows, hit, claimed if claimed is not None else set())
    _fill(ops, hit)
    if filled is not None:
        paired = {i for row in rows for i in row if i is not None}
        filled.update(i for i, h in enumerate(hit) if h is not None and i not in paired)
    return {ops[i].name: h for i, h in enumerate(hit) if h is not None}


def _claim(ops: Sequence[Node], runs: Sequence[Run], rows: Sequence[Sequence[int | None]],
           hit: list[tuple[str, int] | None], claimed: set[tuple[int, int]]) -> None:
    """A Dynamo op of a name the tracer never recorded, in module ``M``, stands for a call of ``M``
    whose inside the tracer saw as other ops (eval-mode ``nn.TransformerEncoderLayer`` is one
    ``_transformer_encoder_layer_fwd`` under torch.compile and its Python path while the tracer's
    mode is on): it takes the next whole call of ``M`` in the eager ops, between the eager ops
    matched before and after it, when none of that call's ops matched and none reads a tensor's
    value."""
    names = {op_key(n)[2] for n in ops}
    seq = [(r, j, row[j]) for r, row in enumerate(rows) for j in range(len(row))]
    after = [len(ops)] * (len(seq) + 1)  # the eager op matched next after each position
    for k in range(len(seq) - 1, -1, -1):
        e = seq[k][2]
        after[k] = e if e is not None else after[k + 1]
    cursor = 0
    for k, (r, j, i) in enumerate(seq):
        if i is not None:
            cursor = i + 1
            continue
        d = runs[r][1][j]
        kind: str = getattr(d, "kind", "")  # a getitem of a tuple, a call of no tensor: no call of a module
        if not d.module or d.name in names or kind:
            continue
        hi = min(after[k], cursor + WINDOW)
        block = _call_of(ops, d.module, cursor, hi)
        if block is not None and all(hit[b] is None and not ops[b].attrs.get("data_dependent") for b in block):
            for b in block:
                hit[b] = (runs[r][0], r)
            cursor = block[-1] + 1
            claimed.add((r, j))
            continue
        # a library call inside a call of the module (DTensor's from_local / redistribute: their
        # views and collectives): that call's unmatched ops up to the next matched one
        call = _call_path(ops[cursor - 1].module if cursor else ops[cursor].module if cursor < len(ops) else "",
                          d.module)
        for b in range(cursor, hi):
            m = ops[b].module
            if call is None or hit[b] is not None or ops[b].attrs.get("data_dependent") or \
                    not (m == call or m.startswith(call + ".")):
                break
            hit[b] = (runs[r][0], r)
            cursor = b + 1
            claimed.add((r, j))


def _call_path(path: str, module: str) -> str | None:
    """The path of the call of ``module`` (up to list indices) an eager op of module ``path`` runs
    in (``blocks.3`` for ``blocks.3.attn`` and ``blocks.0``), or ``None``."""
    depth = module.count(".") + 1
    parts = path.split(".")
    prefix = ".".join(parts[:depth])
    return prefix if len(parts) >= depth and _same_module(prefix, module) else None


def _call_of(ops: Sequence[Node], module: str, lo: int, hi: int) -> range | None:
    """The eager ops of the first call of ``module`` (up to list indices, :func:`_same_module`)
    in ``ops[lo:hi]``, if it starts there: its first op and the ops after it inside the same call."""
    depth = module.count(".") + 1
    for i in range(lo, hi):
        parts = ops[i].module.split(".")
        if len(parts) >= depth and _same_module(".".join(parts[:depth]), module):
            prefix = ".".join(parts[:depth])

            def inside(m: str, prefix: str = prefix) -> bool:
                return m == prefix or m.startswith(prefix + ".")

            if i > 0 and inside(ops[i - 1].module):  # the call began before: not all of it is here
                return None
            end = i + 1
            while end < len(ops) and inside(ops[end].module):
                end += 1
            return range(i, end)
    return None


def pair(ops: Sequence[Node], runs: Sequence[Run], *, start: int = 0) -> list[list[int | None]]:
    """For each run, for each of its Dynamo ops in order, the index in ``ops`` of the eager op it
    is (``None``: none found), looking from ``ops[start]`` on: the op-for-op matching
    :func:`assign` is built on, which numerics use to compare a compiled graph's values with the
    eager ones. A Dynamo op with a user line matches an eager op of the same :func:`op_key`; one
    without (``file == ""``: no user frame inside the compiled code) an eager op of the same name
    on any line (:func:`matchable`). Matched indices increase along the runs."""
    by_key: dict[tuple[str, int, str], list[int]] = {}
    by_name: dict[str, list[int]] = {}
    for e, n in enumerate(ops):
        key = op_key(n)
        by_key.setdefault(key, []).append(e)
        by_name.setdefault(key[2], []).append(e)
    flat = [d for _, dops in runs for d in dops]
    cands = [by_key.get((d.file, d.line, d.name)) if d.file else by_name.get(d.name) for d in flat]
    taken = [False] * len(ops)

    def best(k: int, lo: int, also: int = -1) -> int:
        """How many of the :data:`LOOKAHEAD` Dynamo ops from ``k`` on can be paired, in order, with
        free eager ops from ``lo`` on (eager op ``also`` taken too): the length of their longest
        common subsequence under the match predicate (Hunt-Szymanski: ``ends[t]`` is the smallest
        eager index a pairing of ``t + 1`` ops can end at)."""
        ends: list[int] = []
        for q in range(k, min(k + LOOKAHEAD, len(flat))):
            cs = cands[q]
            if not cs:
                continue
            mod = flat[q].module
            j, hi = bisect_left(cs, lo), lo + WINDOW
            last = ends[-1] if ends else lo - 1
            free = []
            while j < len(cs) and cs[j] < hi:
                c = cs[j]
                if not taken[c] and c != also and (not mod or _same_module(ops[c].module, mod)):
                    free.append(c)
                    if c > last:  # a later one could only lengthen the pairing to the same length
                        break
                j += 1
            for c in reversed(free):  # decreasing: one Dynamo op extends a pairing once
                t = bisect_left(ends, c)
                if t == len(ends):
                    ends.append(c)
                else:
                    ends[t] = c
        return len(ends)

    cursor = start
    found: list[int | None] = []
    for k, d in enumerate(flat):
        i = None
        cs = cands[k]
        if cs:  # find(k, cursor), inline: this loop runs once per Dynamo op
            j = bisect_left(cs, cursor)
            while j < len(cs) and cs[j] < cursor + WINDOW:
                c = cs[j]
                if not taken[c] and (not d.module or _same_module(ops[c].module, d.module)):
                    i = c
                    break
                j += 1
        # skipping eager ops to reach i: worth it only if as many of the ops after can pair as without
        if i is not None and i > cursor and best(k + 1, cursor) > 1 + best(k + 1, i + 1, i):
            i = None
        if i is not None:
            taken[i], cursor = True, i + 1
        found.append(i)
    out: list[list[int | None]] = []
    at = 0
    for _, dops in runs:
        out.append(found[at:at + len(dops)])
        at += len(dops)
    return out


def matchable(n: Node, keys: Collection[tuple[str, int, str]]) -> bool:
    """Whether eager op ``n`` can match a Dynamo op whose ``(file, line, name)`` is in ``keys``: the
    same :func:`op_key`, or the same name where the Dynamo op has no user line (``("", 0, name)``).
    Both sides take the innermost user frame the same way
    (:func:`~fxviz.torchbridge.source.is_user_file`), but Dynamo's frames start at the function it
    compiled: where that function and all it inlined are library code (an ``nn.Sequential`` of
    ``torch.nn`` layers, the frame resumed after a break inside one), Dynamo has no user frame while
    the eager op's is further out (the line that called the model)."""
    key = op_key(n)
    return key in keys or ("", 0, key[2]) in keys


_INDEX = re.compile(r"(?:(?<=\.)|^)\d+(?=\.|$)")


def _same_module(eager: str, dynamo: str) -> bool:
    """Paths equal up to the indices of list entries: a graph compiled for ``blocks.0``'s own
    ``forward`` runs again for ``blocks.1`` and keeps the paths of its first compile (``0.lin`` and
    ``4.lin`` in a top-level ``nn.Sequential`` too)."""
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


__all__ = ["LOOKAHEAD", "WINDOW", "DynamoOp", "Run", "assign", "matchable", "op_key", "pair"]
