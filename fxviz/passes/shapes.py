"""``shapes``: every edge carries the shape and dtype of what flows along it.

Capture records each op's output metadata (export's fake values, fake-tensor propagation for fx,
the real tensors for the eager tracer). This pass gives output nodes the metadata of what they
return and lists the ops still without metadata, so renderers can say "unknown" rather than guess.
"""

from __future__ import annotations

from fxviz.ir import Graph


def propagate_shapes(graph: Graph) -> Graph:
    for n in graph.nodes:
        if n.kind == "output" and n.inputs and not n.outputs:
            meta = graph.meta_of(n.inputs[0])
            if meta is not None:
                n.outputs = (meta,)
    missing = [n.name for n in graph.nodes if n.kind == "op" and not n.outputs]
    graph.annotations["shapes"] = {"missing": missing}
    return graph
