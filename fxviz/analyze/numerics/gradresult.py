"""The gradient half of a ``backward=True`` numerics result, as plain data (no torch): the error of
each parameter's gradient against eager float32 (:class:`Grads`), the worst per module, and the
first module, in backward order, whose gradient is beyond tolerance. Written on the graph as the
``grad_error`` overlay (parameter nodes and module calls)."""

from __future__ import annotations

import math

from fxviz.analyze.numerics.result import Grads
from fxviz.ir import Graph
from fxviz.passes.overlays import set_overlay


def annotate_grads(g: Graph, grads: Grads, against: str) -> None:
    """The ``grad_error`` overlay: each parameter node's gradient error, each module call the worst of
    its own parameters' (relative RMS, log scale)."""
    nodes: dict[str, float] = {}
    for n in g.nodes:
        if n.kind == "parameter":
            e = grads.params.get(str(n.target))
            if e is not None and e.comparable and math.isfinite(e.rel_rms):
                nodes[n.name] = e.rel_rms
                n.attrs["grad_numerics"] = e.text()
    modules = {c.id: e.rel_rms for c in g.calls.walk() if c.stack and (e := grads.modules.get(c.path)) is not None
               and e.comparable and math.isfinite(e.rel_rms)}
    set_overlay(g, "grad_error", label=f"gradient error vs {against}", kind="number", unit="rel RMS", scale="log",
                reduce="max", nodes=nodes, modules=modules,
                description=f"‖{against} − eager‖ / ‖eager‖ of each parameter's gradient, and per module call "
                            "the worst of its own parameters' (eager float32 is the reference; 0: identical)")


__all__ = ["Grads", "annotate_grads"]
