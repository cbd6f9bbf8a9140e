"""The torch.compile coverage map: which ops of a forward ran inside a compiled graph, where and why
Dynamo broke the graph, and what recompiled.

``record`` runs the model under ``torch.compile`` with a recording backend (needs torch), ``shapes``
reads each graph's guards and symbolic sizes from torch's records, ``breaks`` groups the graph
breaks (categories from torch's registry of break types; ``frames`` tells the user's code from
libraries), ``match`` lays the Dynamo graphs over the eager tracer's graph, ``result`` is the
:class:`CompileMap` (plain data, JSON), ``overlay`` writes it on the eager graph as overlays and
panels, ``run`` chains them:

    >>> import fxviz
    >>> cm = fxviz.compile_map(model, (x,), backend="aot_eager")
    >>> print(cm.header())
    4 graphs, 1 break (1 cause), 89% of ops compiled (8/9)  ·  backend aot_eager
    >>> cm.graph.tree(overlay="coverage")      # the module tree with each call's share compiled


A saved map (``CompileMap.to_json``) reads back and renders without torch: ``compile_map`` (which
runs the model) is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fxviz.analyze.compilemap.result import BreakGroup, CompiledGraph, CompileMap, ModuleCoverage, Recompile

if TYPE_CHECKING:
    from fxviz.analyze.compilemap.run import compile_map


def __getattr__(name: str) -> Any:
    if name == "compile_map":
        from fxviz.analyze.compilemap.run import compile_map

        return compile_map
    raise AttributeError(f"module 'fxviz.analyze.compilemap' has no attribute {name!r}")

__all__ = ["BreakGroup", "CompileMap", "CompiledGraph", "ModuleCoverage", "Recompile", "compile_map"]
