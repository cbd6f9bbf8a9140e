"""What a run of passes works out once and shares: the module call tree, its calls in walk order and
the nodes by name. No torch.

:attr:`fxviz.ir.Graph.calls` derives the tree from the node stacks on every access; the passes of
one capture would build it once each, and walk it and index the nodes by name once each again.
:func:`run_passes` keeps what it built for the passes that follow, as long as each pass that ran
since is one of :data:`KEEPS_TREE` (passes that change no node's stack, kind, name or region
attributes, and add or remove no node: what :func:`fxviz.calls.call_tree` reads).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from fxviz.calls import Call, CallTree, call_tree
from fxviz.ir import Graph

if TYPE_CHECKING:
    from fxviz.ir import Node

#: Passes that leave what the call tree is derived from as they found it.
KEEPS_TREE: frozenset[str] = frozenset({"shapes", "stats", "fold", "plumbing", "flops"})


class Shared:
    """One graph's facts for a run of passes: its call tree, and on first use its calls in
    :meth:`fxviz.calls.Call.walk` order (parents first)."""

    __slots__ = ("_by_name", "_calls", "graph", "tree")

    def __init__(self, graph: Graph, tree: CallTree) -> None:
        self.graph = graph
        self.tree = tree
        self._calls: list[Call] | None = None
        self._by_name: dict[str, Node] | None = None

    @property
    def calls(self) -> list[Call]:
        if self._calls is None:
            self._calls = self.tree.root.listed()
        return self._calls

    @property
    def by_name(self) -> dict[str, Node]:
        if self._by_name is None:
            self._by_name = {n.name: n for n in reversed(self.graph.nodes)}  # the first of a name wins
        return self._by_name


_shared: list[dict[int, Shared]] = []  # one cache per run of passes in progress


def shared(graph: Graph) -> Shared:
    """``graph``'s shared facts: those the current run of passes already worked out, else new ones
    (kept for the passes that follow while a run is in progress)."""
    if _shared:
        hit = _shared[-1].get(id(graph))
        if hit is not None and hit.graph is graph:
            return hit
    facts = Shared(graph, call_tree(graph.nodes))
    if _shared:
        _shared[-1][id(graph)] = facts
    return facts


def tree_of(graph: Graph) -> CallTree:
    """``graph``'s call tree: the one the current run of passes already built, else a new one."""
    return shared(graph).tree


def calls_of(graph: Graph) -> list[Call]:
    """Every call of ``graph``'s tree, parents first (as ``tree_of(graph).walk()``), listed once
    per run of passes."""
    return shared(graph).calls


def nodes_by_name(graph: Graph) -> dict[str, Node]:
    """Node name -> the first node of that name (as :meth:`fxviz.ir.Graph.node`), built once per
    run of passes."""
    return shared(graph).by_name


def drop(cache: dict[int, Shared]) -> None:
    """Empty a cache of :func:`sharing`, breaking the reference cycles of the call trees in it
    (:meth:`fxviz.calls.CallTree.release`): no pass keeps a call past its run (they annotate
    graphs with plain data), so reference counting frees them at once."""
    for facts in cache.values():
        facts.tree.release(facts._calls)
    cache.clear()


@contextmanager
def sharing() -> Iterator[dict[int, Shared]]:
    """Share call trees among the passes run inside; the caller empties the returned cache
    (:func:`drop`) after a pass that may change the tree. Inside another such block (a capture that
    annotates its graph after its passes: the ``comm`` overlay), the enclosing block's cache is the
    one shared, so what the passes built serves the work after them. The trees are released when
    the outermost block ends (:func:`drop`): get none inside to keep."""
    if _shared:
        yield _shared[-1]
        return
    cache: dict[int, Shared] = {}
    _shared.append(cache)
    try:
        yield cache
    finally:
        _shared.pop()
        drop(cache)


__all__ = ["KEEPS_TREE", "Shared", "calls_of", "drop", "nodes_by_name", "shared", "sharing", "tree_of"]
