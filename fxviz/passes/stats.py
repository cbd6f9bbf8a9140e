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
    """``"a.b.c"`` -> ``["", "a", "a.b", "a.b.c"]``."""
    out = [""]
    start = 0
    while path:
        i = path.find(".", start)
        if i < 0:
            out.append(path)
            break
        out.append(path[:i])
        start = i + 1
    return out


@register("stats")
def compute_stats(graph: Graph) -> Graph:
    # own counts per module first, then each module adds its own to every enclosing module once:
    # modules are far fewer than nodes
    own_params: Counter[str] = Counter()
    own_ops: Counter[str] = Counter()
    ops: Counter[str] = Counter()
    calls: dict[str, set[int]] = {}
    for n in graph.nodes:
        if n.kind == "parameter":
            if "tied_to" not in n.attrs:
                own_params[n.module] += (n.meta.numel if n.meta else 0) or 0
        elif n.kind == "op":
            ops[short_target(n.target)] += 1
            own_ops[n.module] += 1
            for path, call in n.stack:
                calls.setdefault(path, set()).add(call)

    mods: dict[str, dict[str, Any]] = {}
    prefixes = {path: _prefixes(path) for path in {"", *own_params, *own_ops, *calls}}
    for chain in prefixes.values():
        for p in chain:
            mods.setdefault(p, {"params": 0, "ops": 0, "own_ops": 0, "calls": 0})
    for path, count in own_params.items():
        for p in prefixes[path]:
            mods[p]["params"] += count
    for path, count in own_ops.items():
        mods[path]["own_ops"] = count
        for p in prefixes[path]:
            mods[p]["ops"] += count
    for path, seen in calls.items():
        mods[path]["calls"] = len(seen)
    mods[""]["calls"] = 1
    graph.annotations["stats"] = {
        "total_params": sum(own_params.values()),
        "total_ops": sum(ops.values()),
        "op_counts": dict(ops.most_common()),
        "modules": mods,
    }
    return graph
