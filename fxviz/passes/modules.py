"""``module_paths``: every module path a node mentions is known, with its class, and every piece of
state belongs to a module.

Capture fills ``Graph.modules`` from the live model; a graph built by hand or loaded from JSON may
lack entries. Parameters and buffers belong to the module that owns them (their state-dict prefix).
A constant no module owns (a tensor made inside the forward: export's lifted constants, the tensors
the eager tracer sees ATen's ``lift_fresh`` read, a global) belongs to the module call of its first
reader, as a parameter belongs to its owner, so that it groups and folds with its layer instead of
floating to the top of the graph (2,418 of them at the root of a 1,200-layer decoder).
"""

from __future__ import annotations

from fxviz.calls import STATE_KINDS
from fxviz.ir import Graph, ModuleInfo


def annotate_module_paths(graph: Graph) -> Graph:
    for n in graph.nodes:
        if n.kind in STATE_KINDS and not n.stack and "." in n.target:
            n.stack = ((n.target.rpartition(".")[0], 0),)
    _place_constants(graph)
    paths = {p for n in graph.nodes for p, _ in n.stack}
    for path in sorted(paths):
        parts = path.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            graph.modules.setdefault(prefix, ModuleInfo(""))
    graph.modules.setdefault("", ModuleInfo(graph.name))
    return graph


def _place_constants(graph: Graph) -> None:
    """Give each constant without an owner the whole module call stack of the first op that reads
    it (a constant read only by the model's outputs, or by ops of the model itself, stays there)."""
    orphans = {n.name: n for n in graph.nodes if n.kind == "constant" and not n.stack}
    if not orphans:
        return
    for n in graph.nodes:
        if n.kind != "op":
            continue
        for r in n.inputs:
            c = orphans.pop(r.node, None)
            if c is not None:
                c.stack = n.stack
        if not orphans:
            return


__all__ = ["annotate_module_paths"]
