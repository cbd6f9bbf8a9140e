"""The module call tree a run of passes shares. No torch.

:attr:`fxviz.ir.Graph.calls` derives the tree from the node stacks on every access; the passes of
one capture would build it once each. :func:`run_passes` keeps the tree it built for the passes
that follow, as long as each pass that ran since is one of :data:`KEEPS_TREE` (passes that change
no node's stack, kind, name or region attributes: what :func:`fxviz.calls.call_tree` reads).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fxviz.calls import CallTree, call_tree
from fxviz.ir import Graph

#: Passes that leave what the call tree is derived from as they found it.
KEEPS_TREE: frozenset[str] = frozenset({"shapes", "stats", "fold", "plumbing", "flops"})

_shared: list[dict[int, tuple[Graph, CallTree]]] = []  # one cache per run of passes in progress


def tree_of(graph: Graph) -> CallTree:
    """``graph``'s call tree: the one the current run of passes already built, else a new one."""
    if not _shared:
        return call_tree(graph.nodes)
    cache = _shared[-1]
    hit = cache.get(id(graph))
    if hit is not None and hit[0] is graph:
        return hit[1]
    tree = call_tree(graph.nodes)
    cache[id(graph)] = (graph, tree)
    return tree


@contextmanager
def sharing() -> Iterator[dict[int, tuple[Graph, CallTree]]]:
    """Share call trees among the passes run inside; the caller empties the returned cache after
    a pass that may change the tree."""
    cache: dict[int, tuple[Graph, CallTree]] = {}
    _shared.append(cache)
    try:
        yield cache
    finally:
        _shared.pop()


__all__ = ["KEEPS_TREE", "sharing", "tree_of"]
