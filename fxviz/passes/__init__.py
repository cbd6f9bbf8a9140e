"""Passes: functions ``Graph -> Graph`` that annotate a captured graph.

Each pass is registered under a short name and writes its results on the graph (node fields it
owns, or ``graph.annotations[name]``). Passes are idempotent: running one twice gives the same
graph. :func:`run_passes` runs a list of them and names the failing pass and those before it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from fxviz.errors import PassError
from fxviz.ir import Graph

Pass = Callable[[Graph], Graph]

PASSES: dict[str, Pass] = {}


def register(name: str) -> Callable[[Pass], Pass]:
    def deco(fn: Pass) -> Pass:
        PASSES[name] = fn
        return fn

    return deco


def run_passes(graph: Graph, names: Iterable[str]) -> Graph:
    """Run the passes called ``names`` in order."""
    done: list[str] = []
    for name in names:
        fn = PASSES.get(name)
        if fn is None:
            raise PassError(f"unknown pass {name!r}; known passes: {', '.join(PASSES)}")
        try:
            graph = fn(graph)
        except Exception as e:
            raise PassError(f"pass {name!r} failed after {done} on graph {graph.name!r}: {e}") from e
        done.append(name)
    return graph


# Registration happens on import; the order here is the default order.
from fxviz.passes import fold as _fold  # noqa: E402,F401, I001
from fxviz.passes import modules as _modules  # noqa: E402,F401
from fxviz.passes import shapes as _shapes  # noqa: E402,F401
from fxviz.passes import stats as _stats  # noqa: E402,F401

DEFAULT: tuple[str, ...] = ("module_paths", "shapes", "stats", "fold")

__all__ = ["DEFAULT", "PASSES", "Pass", "register", "run_passes"]
