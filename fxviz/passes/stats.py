"""``stats``: parameter and op counts per module, and op counts for the whole graph.

Writes ``graph.annotations["stats"]``::

    {"total_params": 1234, "total_ops": 56, "op_counts": {"linear": 12, ...},
     "modules": {"h.0": {"params": 7087872, "ops": 31}, ...}}

Both counts include the module's descendants in the attribute hierarchy (``h.0`` counts
``h.0.attn``). A parameter shared by two modules (tied weights) counts once, for the module that
owns its name.
"""

from __future__ import annotations

from collections import Counter

from fxviz.calls import prefixes
from fxviz.ir import Graph
from fxviz.ops import short_name


def compute_stats(graph: Graph) -> Graph:
    # own counts per module first, then each module adds its own to every enclosing module once:
    # modules are far fewer than nodes
    own_params: Counter[str] = Counter()
    for n in graph.nodes:
        if n.kind == "parameter" and "tied_to" not in n.attrs:
            own_params[n.module] += (n.meta.numel if n.meta else 0) or 0
    own_ops: Counter[str] = Counter()
    for call in graph.calls.walk():
        own_ops[call.path] += len(call.ops)
    ops = Counter(short_name(n.target) for n in graph.nodes if n.kind == "op")

    mods: dict[str, dict[str, int]] = {"": {"params": 0, "ops": 0}}
    for what, counter in (("params", own_params), ("ops", own_ops)):
        for path, count in counter.items():
            for p in prefixes(path):
                m = mods.setdefault(p, {"params": 0, "ops": 0})
                m[what] += count
    graph.annotations["stats"] = {
        "total_params": sum(own_params.values()),
        "total_ops": sum(ops.values()),
        "op_counts": dict(ops.most_common()),
        "modules": mods,
    }
    return graph
