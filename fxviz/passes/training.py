"""The overlays of a training step (``capture(backward=True)``), derived from the IR on every read
like the other built-in overlays (:mod:`fxviz.passes.overlays`). No torch.

* ``phase``: a category per node, ``forward`` / ``backward`` / ``recompute``; a module call whose ops
  are all of one phase shows it.
* ``saved``: bytes of saved activations (``Graph.saved``) per forward op that saved them, and per
  module call the total over the ops inside it, any depth; ``saved_own``: per module call the
  bytes its own ops saved (not its submodules'). Both add up to the records' bytes exactly.
"""

from __future__ import annotations

from typing import Any

from fxviz.calls import CallTree
from fxviz.ir import Graph

_PHASE_COLORS = {"forward": "#4e79a7", "backward": "#e15759", "recompute": "#f28e2b"}


def phase_overlay(graph: Graph, tree: CallTree) -> dict[str, Any]:
    """The phase of each op and output; empty for a forward-only graph."""
    if all(n.phase == "forward" for n in graph.nodes):
        nodes: dict[str, str] = {}
    else:
        nodes = {n.name: n.phase for n in graph.nodes if n.kind in ("op", "output", "input")}
    return {"label": "phase", "kind": "category", "mixed": "both",
            "description": "forward or backward pass of the training step (capture(backward=True))",
            "categories": {k: {"label": k, "color": c} for k, c in _PHASE_COLORS.items()}
            | {"both": {"label": "forward and backward", "color": "#bab0ac"}},
            "nodes": nodes, "modules": {}}


def saved_bytes(graph: Graph) -> dict[str, int]:
    """Saved bytes per node that saved something (records of zero bytes leave a 0)."""
    out: dict[str, int] = {}
    for s in graph.saved:
        out[s.node] = out.get(s.node, 0) + s.bytes
    return out


def saved_overlay(graph: Graph, tree: CallTree) -> dict[str, Any]:
    """Saved-activation bytes per op, and per module call with its submodules."""
    nodes = saved_bytes(graph)
    modules = {c.id: sum(nodes.get(x, 0) for x in c.nodes) for c in tree.walk() if c.stack} if nodes else {}
    return {"label": "saved bytes", "kind": "number", "unit": "B", "scale": "log", "reduce": "sum",
            "description": "bytes autograd keeps for the backward (each storage once; parameters, inputs and "
                           "views of counted storage cost 0): per op that saved them, per module with its submodules",
            "nodes": nodes, "modules": modules}


def saved_own_overlay(graph: Graph, tree: CallTree) -> dict[str, Any]:
    """Saved-activation bytes per module call, its own ops only."""
    nodes = saved_bytes(graph)
    modules = {c.id: sum(nodes.get(x, 0) for x in c.ops) for c in tree.walk() if c.stack} if nodes else {}
    return {"label": "saved bytes (own ops)", "kind": "number", "unit": "B", "scale": "log",
            "description": "bytes autograd keeps for the backward, saved by a module's own ops (not its submodules')",
            "nodes": nodes, "modules": modules}





def checkpoint_saved_overlay(graph: Graph, tree: CallTree) -> dict[str, Any]:
    """Bytes activation checkpointing saved: per recompute op what its forward op would have kept
    for the backward without checkpoint (``attrs["would_save"]``), per module call with its submodules."""
    nodes = {n.name: int(n.attrs.get("would_save", 0)) for n in graph.nodes if n.phase == "recompute"}
    fwd = {n.attrs["recomputes"]: b for n in graph.nodes if n.phase == "recompute" for b in [nodes[n.name]]}
    modules = {c.id: sum(fwd.get(x, 0) for x in c.nodes) for c in tree.walk() if c.stack} if nodes else {}
    return {"label": "checkpoint saved", "kind": "number", "unit": "B", "scale": "log", "reduce": "sum",
            "description": "bytes torch.utils.checkpoint saved: what the recomputed ops would have kept for the "
                           "backward without it (per recompute op, per module with its submodules)",
            "nodes": nodes, "modules": modules}
__all__ = ["checkpoint_saved_overlay", "phase_overlay", "saved_bytes", "saved_overlay", "saved_own_overlay"]
