"""``stats``: parameter and op counts per module, and op counts for the whole graph.

Writes ``graph.annotations["stats"]``::

    {"total_params": 1234, "total_ops": 56, "op_counts": {"linear": 12, ...},
     "modules": {"h.0": {"params": 7087872, "ops": 31, "own_ops": 2, "calls": 1}, ...}}

``params`` and ``ops`` include the module's descendants; ``own_ops`` counts only ops directly in it.
A parameter shared by two modules (tied weights) counts once, for the module that owns its name.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from fxviz.ir import Graph, short_target
from fxviz.passes import register


def _prefixes(path: str) -> list[str]:
    if not path:
        return [""]
    parts = path.split(".")
    return [""] + [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


@register("stats")
def compute_stats(graph: Graph) -> Graph:
    mods: dict[str, dict[str, Any]] = {}

    def entry(path: str) -> dict[str, Any]:
        e = mods.get(path)
        if e is None:
            e = mods[path] = {"params": 0, "ops": 0, "own_ops": 0, "calls": 0}
        return e

    ops: Counter[str] = Counter()
    total_params = 0
    for n in graph.nodes:
        if n.kind == "parameter" and "tied_to" not in n.attrs:
            count = (n.meta.numel if n.meta else 0) or 0
            total_params += count
            for p in _prefixes(n.module):
                entry(p)["params"] += count
        elif n.kind == "op":
            ops[short_target(n.target)] += 1
            entry(n.module)["own_ops"] += 1
            for p in _prefixes(n.module):
                entry(p)["ops"] += 1
    for scope in graph.scopes.walk():
        entry(scope.path)["calls"] = scope.calls
    graph.annotations["stats"] = {
        "total_params": total_params,
        "total_ops": sum(ops.values()),
        "op_counts": dict(ops.most_common()),
        "modules": mods,
    }
    return graph
