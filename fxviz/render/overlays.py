"""Overlays as renderers show them: a value for every node and every box, the colour of each
category, and numbers in words (``1.2 GFLOP``, ``3.4 MB``). No torch.

The overlays themselves come from :func:`fxviz.passes.overlays.overlays` (built-in ones derived
from the IR, stored ones written by passes, analyzers and users); this module only turns them into
what the report's view-model, the tree's value column and the Model Explorer export draw.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fxviz.calls import CallTree
from fxviz.ir import Graph
from fxviz.passes.overlays import overlays, reduce_values
from fxviz.render.view import CATEGORY_COLORS, KIND_COLORS, ModuleBoxes, bounded

#: Units that read best with SI prefixes; bytes use powers of 1024.
_PREFIXES = (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3))


def format_value(spec: Mapping[str, Any], v: Any) -> str:
    """A value as the tree and the details panel print it: ``1.5 GFLOP``, ``12.0 MiB``,
    ``124.4M params``, ``0.031``, a category's label."""
    if v is None:
        return ""
    if spec.get("kind") == "category":
        cats = spec.get("categories") or {}
        label = cats.get(v, {}).get("label") if isinstance(cats.get(v), dict) else None
        return bounded(str(label or v), 60)
    unit = str(spec.get("unit", ""))
    div: float
    x = float(v)
    if unit == "B":
        for prefix, div in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if abs(x) >= div:
                return f"{x / div:.1f} {prefix}B"
        return f"{x:.0f} B"
    for prefix, div in _PREFIXES:
        if abs(x) >= div:
            number = f"{x / div:.1f}{prefix}"
            break
    else:
        number = f"{x:.0f}" if x == int(x) else f"{x:.3g}"
    return f"{number} {unit}" if unit else number


def category_colors(spec: Mapping[str, Any], *, families: bool = False) -> dict[str, str]:
    """Category -> colour: the overlay's own, an op family's (:data:`KIND_COLORS`, with
    ``families``: the op family overlay, so it agrees with every node's colour), or the next of
    :data:`CATEGORY_COLORS` in order of first appearance."""
    out: dict[str, str] = {}
    keys = list(spec.get("categories") or {})
    keys += [v for v in dict.fromkeys((spec.get("nodes") or {}).values()) if isinstance(v, str) and v not in keys]
    k = 0
    for key in keys:
        c = (spec.get("categories") or {}).get(key) or {}
        color = c.get("color") if isinstance(c, dict) else None
        if color is None:
            color = KIND_COLORS.get(key) if families else None
        if color is None:
            color = CATEGORY_COLORS[k % len(CATEGORY_COLORS)]
            k += 1
        out[key] = color
    return out


def box_members(graph: Graph, boxes: ModuleBoxes) -> dict[str, list[str]]:
    """Box id -> the nodes inside it, at any depth (parameters with their owner's first call)."""
    out: dict[str, list[str]] = {gid: [] for gid in boxes.groups}
    for n in graph.nodes:
        for gid in boxes.ancestors(boxes.node_group.get(n.name)):
            out[gid].append(n.name)
    return out


def box_values(spec: Mapping[str, Any], boxes: ModuleBoxes, members: Mapping[str, list[str]]) -> dict[str, Any]:
    """Box id -> the overlay's value for it: a module call's own (``modules``), a run's made from
    its member calls', any other box's made from its nodes' (``reduce``, or for a category the
    value they all share); ``None`` when there is none."""
    nodes = spec.get("nodes") or {}
    modules = spec.get("modules") or {}
    out: dict[str, Any] = {}
    runs: list[str] = []
    for gid, g in boxes.groups.items():
        if g.kind == "run":
            runs.append(gid)
        elif g.kind == "module" and gid in modules:
            out[gid] = modules[gid]
        else:
            out[gid] = reduce_values(spec, (nodes.get(name) for name in members[gid]))
    for gid in runs:  # after their members
        out[gid] = reduce_values(spec, (out.get(m) for m in boxes.members.get(gid, [])))
    return out


def overlay_view(graph: Graph, boxes: ModuleBoxes, group_ids: list[str], tree: CallTree,
                 extra: Mapping[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The view-model's ``overlays``: for each overlay of the graph, and each of ``extra`` (not on
    the graph), its name, label, kind, unit, scale, the range of its values, its categories with
    colours, and one value (or ``null``) per node index and per group index."""
    members = box_members(graph, boxes)
    out = []
    for name, spec in {**overlays(graph, tree), **(extra or {})}.items():
        nodes = spec.get("nodes") or {}
        per_node = [nodes.get(n.name) for n in graph.nodes]
        groups = box_values(spec, boxes, members)
        per_group = [groups.get(gid) for gid in group_ids]
        entry: dict[str, Any] = {
            "name": name, "label": bounded(str(spec.get("label") or name), 60), "kind": spec["kind"],
            "unit": spec.get("unit", ""), "description": spec.get("description", ""),
        }
        if spec["kind"] == "number":
            values = [v for v in [*per_node, *per_group] if v is not None]
            scale = spec.get("scale", "linear")
            if scale == "log":
                values = [v for v in values if v > 0]
            entry.update(scale=scale, min=min(values) if values else None, max=max(values) if values else None)
            entry["categories"] = {}
        else:
            colors = category_colors(spec, families=name == "family")
            cats = spec.get("categories") or {}
            entry.update(scale="", min=None, max=None, categories={
                k: {"label": bounded(str((cats.get(k) or {}).get("label") or k), 60), "color": c}
                for k, c in colors.items()})
        entry["nodes"], entry["groups"] = per_node, per_group
        out.append(entry)
    return out


__all__ = ["box_members", "box_values", "category_colors", "format_value", "overlay_view"]
