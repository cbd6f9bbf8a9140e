"""``module_paths``: every module path a node mentions is known, with its class.

Capture fills ``Graph.modules`` from the live model; a graph built by hand or loaded from JSON may
lack entries. Parameters and buffers belong to the module that owns them (their state-dict prefix).
"""

from __future__ import annotations

from fxviz.calls import STATE_KINDS
from fxviz.ir import Graph, ModuleInfo


def annotate_module_paths(graph: Graph) -> Graph:
    for n in graph.nodes:
        if n.kind in STATE_KINDS and not n.stack and "." in n.target:
            n.stack = ((n.target.rpartition(".")[0], 0),)
    paths = {p for n in graph.nodes for p, _ in n.stack}
    for path in sorted(paths):
        parts = path.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            graph.modules.setdefault(prefix, ModuleInfo(""))
    graph.modules.setdefault("", ModuleInfo(graph.name))
    return graph
