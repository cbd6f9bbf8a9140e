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

from operator import itemgetter

from fxviz.calls import STATE_KINDS
from fxviz.ir import Graph, ModuleInfo, Node


def annotate_module_paths(graph: Graph) -> Graph:
    # one scan: state placed with its owner, the constants no module owns set aside, and every
    # stack once (nodes of one call share one stack tuple). A constant placed afterwards takes an
    # op's stack, which the scan saw: the paths are the same as after placing it.
    stacks: dict[int, tuple[tuple[str, int], ...]] = {}
    orphans: dict[str, Node] = {}
    for n in graph.nodes:
        stack = n.stack
        if not stack and n.kind in STATE_KINDS:
            if "." in n.target:
                stack = n.stack = ((n.target.rpartition(".")[0], 0),)
            elif n.kind == "constant":
                orphans[n.name] = n  # the last of a name, as a dict of them keeps
        stacks[id(stack)] = stack
    if orphans:
        _place_constants(graph, orphans)
    # every path in a stack, and every prefix of those (``h`` of ``h.0``): linear in the calls and
    # their depth, where joining every prefix of every path cost the cube of the nesting depth
    paths: set[str] = set()
    for stack in stacks.values():
        paths.update(map(_path_of, stack))
    known = set(graph.modules)
    missing = set()
    for path in paths - known:  # (a capture's are all known: none left to look at)
        while path and path not in known:
            known.add(path)
            missing.add(path)
            path = path.rpartition(".")[0]
    for path in sorted(missing):
        graph.modules.setdefault(path, ModuleInfo(""))
    graph.modules.setdefault("", ModuleInfo(graph.name))
    return graph


def _place_constants(graph: Graph, orphans: dict[str, Node]) -> None:
    """Give each constant without an owner (``orphans``, by name) the whole module call stack of the
    first op that reads it (a constant read only by the model's outputs, or by ops of the model
    itself, stays there)."""
    for n in graph.nodes:
        if n.kind != "op":
            continue
        for r in n.inputs:
            c = orphans.pop(r.node, None)
            if c is not None:
                c.stack = n.stack
        if not orphans:
            return


_path_of = itemgetter(0)

__all__ = ["annotate_module_paths"]
