"""The ``comm`` overlay: collective bytes per module, and the step's totals per process group. No torch.

Collectives a capture recorded (:mod:`fxviz.torchbridge.comms`) live, as plain JSON, in
``graph.annotations["collectives"]``: one dict per collective with ``kind`` (``all_reduce``,
``all_gather``, ``reduce_scatter``, ``all_to_all``, ``broadcast``, ``send``, ``recv``), ``op``,
``group`` (the process group's name), ``bytes`` (per rank), ``module`` (its path), ``phase`` and
``source``. :func:`write_comm` turns them into the ``comm`` overlay (own bytes per module call;
boxes sum what is inside) and adds totals per group to ``graph.notes``.
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


def write_comm(graph: Graph, records: Sequence[dict[str, Any]]) -> None:
    """Store ``records`` on ``graph``, with the ``comm`` overlay and per-group totals in the notes."""
    graph.annotations["collectives"] = [dict(r) for r in records]
    own: Counter[str] = Counter()
    for r in records:
        own[r.get("module", "")] += int(r.get("bytes", 0))
    tree = graph.calls
    modules: dict[str, int] = {}
    for path, b in own.items():
        calls = tree.calls(path) if path else [tree.root]
        if calls:
            modules[calls[0].id] = modules.get(calls[0].id, 0) + b
    set_overlay(graph, "comm", label="comm", kind="number", unit="B", modules=modules, reduce="sum",
                description="bytes each rank sends in collectives, per module")
    per_group: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for r in records:
        per_group[r.get("group", "")] += int(r.get("bytes", 0))
        count[r.get("group", "")] += 1
    for g in sorted(per_group):
        graph.notes.append(f"collectives on group {g or '?'}: {count[g]}, {per_group[g]:,} bytes per rank")


__all__ = ["collectives", "write_comm"]
