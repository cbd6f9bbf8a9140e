"""The module calls of a comparison, read from both graphs' call trees (:mod:`fxviz.calls`).

A call is keyed by its whole ``stack`` (module path and call index at every level), so ``h.0.attn``
in the first call of ``h.0`` meets its counterpart in the other graph whatever ran before it. Here
the two call trees merge into one report order, modules called a different number of times and
calls only one graph makes become differences, and, once every difference is placed, each call
gets its status. No torch.
"""

from __future__ import annotations

from fxviz.calls import CallTree, Stack
from fxviz.graphdiff.parts import Difference, ModuleDiff, Row, Side
from fxviz.ir import Graph, module_class


def merged_calls(ta: CallTree, tb: CallTree) -> list[Stack]:
    """Every module call of either graph, parents first, in execution order (a preorder of both
    trees): the calls of ``a`` in their order, and a call only ``b`` makes right after the sibling
    it follows in ``b`` (first among its siblings when it follows none that ``a`` makes)."""
    out: list[Stack] = []
    todo: list[Stack] = [()]
    while todo:  # no recursion: module nesting can be thousands of levels deep
        stack = todo.pop()
        out.append(stack)
        ca, cb = ta.by_stack.get(stack), tb.by_stack.get(stack)
        kids = _merge([c.stack for c in ca.children] if ca else [], [c.stack for c in cb.children] if cb else [])
        todo.extend(reversed(kids))
    return out


def _merge(xs: list[Stack], ys: list[Stack]) -> list[Stack]:
    """``xs``, with each key only in ``ys`` after the key it follows in ``ys`` (first when none)."""
    known = set(xs)
    after: dict[Stack | None, list[Stack]] = {}
    prev: Stack | None = None
    for y in ys:
        if y in known:
            prev = y
        else:
            after.setdefault(prev, []).append(y)
    if not after:
        return xs
    out = after.pop(None, [])
    for x in xs:
        out.append(x)
        out.extend(after.get(x, ()))
    return out


def call_count_differences(
    ta: CallTree, tb: CallTree, a: Graph, b: Graph, labels: tuple[str, str]
) -> tuple[list[Difference], set[str]]:
    """A ``calls`` difference for each module the two graphs call a different number of times,
    placed at the first call one graph lacks; and the paths of those modules, whose extra calls are
    then not reported once more as calls only one graph makes."""
    out: list[Difference] = []
    miscounted: set[str] = set()
    for path in [*ta.by_path, *(p for p in tb.by_path if p not in ta.by_path)]:
        na, nb = ta.count(path), tb.count(path)
        if not (na and nb and na != nb):
            continue
        miscounted.add(path)
        # the first call of the path (the earliest stack in sort order, the same for a and b)
        stacks = [c.stack for t in (ta, tb) for c in t.calls(path)]
        first = min((s for s in stacks if s[-1][1] == 0), default=min(stacks))
        out.append(Difference(
            "calls", (*first[:-1], (path, min(na, nb))),
            f"{path} ({module_class(a, path) or module_class(b, path)}) called {na}× in "
            f"{labels[0]}, {nb}× in {labels[1]}",
        ))
    return out, miscounted


def missing_call(
    stack: Stack, ta: CallTree, tb: CallTree, a: Graph, b: Graph, labels: tuple[str, str], miscounted: set[str]
) -> Difference | None:
    """The difference a call only one graph makes is, at the outermost such call (its children are
    part of it) and unless its module's call count already says it."""
    ca, cb = ta.by_stack.get(stack), tb.by_stack.get(stack)
    if not stack or (ca is None) == (cb is None):
        return None
    parent = stack[:-1]
    if (parent in ta.by_stack) != (parent in tb.by_stack) or stack[-1][0] in miscounted:
        return None
    in_a = ca is not None
    call, g = (ca, a) if ca is not None else (cb, b)
    assert call is not None
    if not call.nodes:  # a module that ran and computed nothing (an op-less ``call`` node) differs in nothing
        return None
    inside = [g.node(name) for name in call.nodes]
    side = Side.of(inside, f"{len(inside)} ops")
    path = stack[-1][0]
    cls = module_class(g, path)
    return Difference(
        "only_in_a" if in_a else "only_in_b", stack,
        f"module call {path}{f' ({cls})' if cls else ''} only in {labels[0] if in_a else labels[1]}"
        f" ({len(inside)} ops)",
        side if in_a else None, side if not in_a else None, note="module call",
    )


def module_table(
    found: list[Difference], keys: list[Stack], ta: CallTree, tb: CallTree, a: Graph, b: Graph,
    rows: dict[Stack, list[Row]],
) -> list[ModuleDiff]:
    """Status per module call: a significant difference at a call, or in a call under it, makes
    the call (if both graphs make it) differ."""
    own: dict[Stack, list[str]] = {}
    significant: dict[Stack, int] = {}
    notes: dict[Stack, int] = {}
    for d in found:
        own.setdefault(d.stack, []).append(d.id)
        counts = notes if d.informational else significant
        for depth in range(len(d.stack) + 1):
            prefix = d.stack[:depth]
            counts[prefix] = counts.get(prefix, 0) + 1
    out: list[ModuleDiff] = []
    for k in keys:
        ca, cb = ta.by_stack.get(k), tb.by_stack.get(k)
        if ca is not None and cb is not None:
            status = "differs" if k in significant else "matched"
        else:
            status = "only_in_a" if ca is not None else "only_in_b"
        path = k[-1][0] if k else ""
        cls = module_class(a, path) or module_class(b, path) or (a.name or b.name if not k else "")
        out.append(ModuleDiff(
            k, cls, status, len(ca.ops) if ca else 0, len(cb.ops) if cb else 0, rows.get(k, []),
            own.get(k, []), notes.get(k, 0), significant.get(k, 0),
        ))
    return out


__all__ = ["call_count_differences", "merged_calls", "missing_call", "module_table"]
