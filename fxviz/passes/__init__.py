"""Passes: functions ``Graph -> Graph`` that annotate a captured graph. No torch.

Each pass writes its results on the graph (node fields it owns, or ``graph.annotations[name]``)
and is idempotent: running one twice gives the same graph. :data:`PASSES` is the registry, by
name; :func:`run_passes` runs a list of them and names the failing pass and those before it.
:data:`DEFAULT` is what a capture runs, in this order: module paths first (every later pass reads
``graph.modules``), then shapes, then the statistics, the folding of repeated blocks, and the
classification of export's plumbing (masks, sizes, checks: :mod:`fxviz.passes.plumbing`). A pass
that measures something writes an overlay (:mod:`fxviz.passes.overlays`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from fxviz.errors import PassError
from fxviz.ir import Graph
from fxviz.passes.fold import fold_repeats
from fxviz.passes.modules import annotate_module_paths
from fxviz.passes.plumbing import mark_plumbing
from fxviz.passes.shapes import propagate_shapes
from fxviz.passes.stats import compute_stats
from fxviz.passes.tree import KEEPS_TREE, drop, sharing

Pass = Callable[[Graph], Graph]

#: Every pass by name. Add one here to make it runnable by name (``capture(passes=[...])``).
PASSES: dict[str, Pass] = {
    "module_paths": annotate_module_paths,
    "shapes": propagate_shapes,
    "stats": compute_stats,
    "fold": fold_repeats,
    "plumbing": mark_plumbing,
}

DEFAULT: tuple[str, ...] = ("module_paths", "shapes", "stats", "fold", "plumbing")


def run_passes(graph: Graph, names: Iterable[str]) -> Graph:
    """Run the passes called ``names`` in order; a failure is a :class:`PassError` that names the
    pass, the passes that ran before it and the graph."""
    done: list[str] = []
    with sharing() as trees:  # the call tree is built once for the passes that keep it
        for name in names:
            fn = PASSES.get(name)
            if fn is None:
                raise PassError(f"unknown pass {name!r}; known passes: {', '.join(PASSES)}")
            try:
                graph = fn(graph)
            except Exception as e:
                raise PassError(f"pass {name!r} failed after {done} on graph {graph.name!r}: {e}") from e
            if name not in KEEPS_TREE:
                drop(trees)
            done.append(name)
    return graph


__all__ = ["DEFAULT", "PASSES", "Pass", "run_passes"]
