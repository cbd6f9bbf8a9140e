"""The ``comm`` overlay: collective bytes per module, and the step's totals per mesh dimension. No torch.

Collectives a capture recorded (:mod:`fxviz.fallback.comms`) live, as plain JSON, in
``graph.annotations["collectives"]``: one dict per collective with ``kind`` (``all_reduce``,
``all_gather``, ``reduce_scatter``, ``all_to_all``, ``broadcast``, ``send``, ``recv``), ``op``,
``group`` (the process group's name), ``group_size`` (its ranks), ``mesh_dim`` (the name of the
device mesh dimension the group belongs to, ``dp``/``tp``; empty when it belongs to no named one), ``bytes`` (per rank), ``module`` (its path), ``phase`` and
``source``. :func:`write_comm` turns them into the ``comm`` overlay (own bytes per module call;
boxes sum what is inside) and adds the step's totals per mesh dimension (per group where unnamed) to ``graph.notes`` and
``graph.annotations["comm_totals"]``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from fxviz.ir import Graph
from fxviz.passes.overlays import set_overlay


def collectives(graph: Graph) -> list[dict[str, Any]]:
    found = graph.annotations.get("collectives")
    return found if isinstance(found, list) else []


def _base(op: str) -> str:
    """``c10d_functional.all_reduce``, ``_c10d_functional::all_reduce_`` -> ``all_reduce``."""
    return op.replace("::", ".").rpartition(".")[2].rstrip("_")


def _link_nodes(graph: Graph, records: list[dict[str, Any]]) -> None:
    """Name, in each record, the graph's op node of that collective where the tracer recorded one
    (``node``): the n-th collective of an op is the n-th node of that op, in execution order."""
    nodes: dict[str, list[str]] = {}
    for n in graph.nodes:
        if n.kind == "op" and "c10d" in n.target:
            nodes.setdefault(_base(n.target), []).append(n.name)
    seen: Counter[str] = Counter()
    for r in records:
        base = _base(str(r.get("op", "")))
        k = seen[base]
        seen[base] += 1
        found = nodes.get(base, [])
        if k < len(found):
            r["node"] = found[k]


def write_comm(graph: Graph, records: Sequence[dict[str, Any]]) -> None:
    """Store ``records`` on ``graph``, with the ``comm`` overlay and per-group totals in the notes."""
    records = [dict(r) for r in records]
    _link_nodes(graph, records)
    graph.annotations["collectives"] = records
    tree = graph.calls
    total: Counter[str] = Counter()  # a module's total: its own collectives and those of its submodules
    for r in records:
        parts = r.get("module", "").split(".") if r.get("module") else []
        for k in range(len(parts) + 1):
            total[".".join(parts[:k])] += int(r.get("bytes", 0))
    modules: dict[str, int] = {}
    for path, b in total.items():
        calls = tree.calls(path) if path else [tree.root]
        if calls:
            modules[calls[0].id] = b
    nodes = {r["node"]: int(r.get("bytes", 0)) for r in records if r.get("node")}
    set_overlay(graph, "comm", label="comm", kind="number", unit="B", nodes=nodes, modules=modules, reduce="sum",
                description="bytes each rank sends in collectives: per collective op, and per module with "
                            "its submodules (graph.annotations['collectives'] lists each one)")
    per_dim: Counter[tuple[str, str, int]] = Counter()
    count: Counter[tuple[str, str, int]] = Counter()
    for r in records:
        key = (str(r.get("mesh_dim", "")), str(r.get("group", "")), int(r.get("group_size", 0)))
        per_dim[key] += int(r.get("bytes", 0))
        count[key] += 1
    totals = []
    for dim, g, size in sorted(per_dim):
        key = (dim, g, size)
        totals.append({"mesh_dim": dim, "group": g, "group_size": size, "count": count[key], "bytes": per_dim[key]})
        where = f"mesh dimension {dim} (group {g or '?'}, {size or '?'} ranks)" if dim else \
            f"group {g or '?'} ({size or '?'} ranks)"
        graph.notes.append(f"collectives on {where}: {count[key]}, {per_dim[key]:,} bytes per rank")
    graph.annotations["comm_totals"] = totals

__all__ = ["collectives", "write_comm"]
