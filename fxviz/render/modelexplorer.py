"""Model Explorer's graph JSON: any graph fxviz can capture (eager fallback, partial, fake) opens in
Google's Model Explorer too. No torch.

The format is the one Model Explorer's adapters return and its JSON adapter loads
(``model_explorer.graph_builder`` in the ``ai-edge-model-explorer`` package): ``{"graphs":
[{"id", "nodes": [{"id", "label", "namespace", "attrs", "incomingEdges", "outputsMetadata",
"style"}], "groupNodeAttributes"}]}``. Module calls become namespaces (``transformer/h.0/attn``:
Model Explorer draws each level as a collapsible layer), each output's shape and dtype its
``tensor_shape`` (``float32[1,7,32]``, as Model Explorer's own PyTorch adapter writes it), each op's
label its qualified name (``aten.view``, ``Tensor.view``), each module call's class its qualified
one (``torch.nn.modules.linear.Linear``), as torch records them and that adapter writes them, node
facts its ``attrs``. fxviz's overlays become Model Explorer's per-node data
(``model_explorer.node_data_builder.GraphNodeData``: ``{"results": {node id: {"value"}},
"gradient"}``), one file each, and each node's overlay values also stand in its attributes.

    >>> data = to_model_explorer(graph)
    >>> write_model_explorer(graph, "g.json")      # g.json, g.nodedata.flops.json, ...
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fxviz.calls import Call, CallTree
from fxviz.ir import Graph, Node, TensorMeta
from fxviz.passes.overlays import overlays
from fxviz.render.files import write_text
from fxviz.render.overlays import category_colors, format_value
from fxviz.render.view import ERROR_COLOR, bounded, node_label

__all__ = ["node_data", "to_model_explorer", "write_model_explorer"]

#: Longest node id written; a longer node name gets an id by position (the name is in its attrs).
MAX_ID = 200
#: Colours of a number overlay, from its smallest value to its largest (Model Explorer's gradient).
GRADIENT = [{"stop": 0, "bgColor": "#fff7bc"}, {"stop": 0.5, "bgColor": "#fe9929"}, {"stop": 1, "bgColor": "#b30000"}]


def _ids(graph: Graph) -> dict[str, str]:
    return {n.name: n.name if len(n.name) <= MAX_ID and n.name.isprintable() else f"node_{i}"
            for i, n in enumerate(graph.nodes)}


def _component(call: Call, graph: Graph) -> str:
    """A call's level of the namespace: its name relative to its parent, ``#2`` for a later call;
    no ``/``, which would split the level in two."""
    parent = call.parent.path if call.parent is not None and call.parent.stack else ""
    name = call.path[len(parent) + 1:] if parent and call.path.startswith(parent + ".") else call.path
    name = bounded(name.replace("/", "∕"), 80)
    return f"{name}#{call.index + 1}" if call.index else name


def _namespaces(graph: Graph, tree: CallTree) -> dict[int, str]:
    """id of each call -> its namespace (``transformer/h.0/attn``), parents before children."""
    out: dict[int, str] = {id(tree.root): ""}
    for c in tree.walk():
        if c.stack:
            assert c.parent is not None
            head = out[id(c.parent)]
            out[id(c)] = f"{head}/{_component(c, graph)}" if head else _component(c, graph)
    return out


def _label(n: Node) -> str:
    """A node's label: an op's qualified name as torch records it and Model Explorer's own PyTorch
    adapter labels it (the overload packet of an ATen op, ``aten.view`` for ``aten.view.default``;
    the eager tracer's ``Tensor.view``, ``torch.nn.functional.linear``; a custom op's
    ``mylib::scaled_swish``), so that a bare ``view`` is not read as some other ``view`` and an op
    matches Model Explorer's spelling of it; other nodes' labels as fxviz draws them."""
    t = n.target
    if n.kind != "op" or not t:
        return node_label(n)
    if "::" in t:  # a custom op: torch's qualified op name, without the overload
        ns, _, rest = t.partition("::")
        return f"{ns}::{rest.split('.', 1)[0]}"
    parts = t.split(".")
    if len(parts) == 3 and parts[0] in ("aten", "prims", "quantized"):
        return f"{parts[0]}.{parts[1]}"
    return bounded(t, 200)


def _tensor_shape(m: TensorMeta) -> str:
    if not m.is_tensor:
        return f"{m.dtype}[]" + (f" = {m.value}" if m.value is not None else "")
    return f"{m.dtype}[{','.join(str(d) for d in m.shape)}]"


def _kv(key: str, value: Any) -> dict[str, str]:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return {"key": key, "value": bounded(text, 2000)}


def to_model_explorer(graph: Graph) -> dict[str, Any]:
    """The graph as Model Explorer's graph JSON (``{"graphs": [graph]}``)."""
    tree = graph.calls
    spaces = _namespaces(graph, tree)
    ids = _ids(graph)
    shown = overlays(graph, tree)
    nodes = []
    for n in graph.nodes:
        call = tree.of(n.name)
        entry: dict[str, Any] = {
            "id": ids[n.name], "label": _label(n), "namespace": spaces.get(id(call), "") if n.kind not in (
                "input", "output") else "",
            "attrs": _attrs(n, shown),
            "incomingEdges": [{"sourceNodeId": ids[r.node], "sourceNodeOutputId": str(r.index),
                               "targetNodeInputId": str(k)} for k, r in enumerate(n.inputs)],
            "outputsMetadata": [{"id": str(k), "attrs": [_kv("tensor_shape", _tensor_shape(m))]}
                                for k, m in enumerate(n.outputs)],
        }
        if n.error is not None:
            entry["style"] = {"backgroundColor": "#ffcdd2", "borderColor": ERROR_COLOR, "hoveredBorderColor": ERROR_COLOR}
        nodes.append(entry)
    groups: dict[str, dict[str, str]] = {"": {"model": bounded(graph.name or "model"), "captured by": graph.method}}
    if graph.error:
        groups[""]["error (the model raised)"] = bounded(graph.error, 2000)
    for a in graph.attempts:
        if not a.ok:
            groups[""][f"{a.method} failed"] = bounded(a.reason(), 2000)
    stats = graph.annotations.get("stats", {}).get("modules", {})
    for c in tree.walk():
        if not c.stack:
            continue
        # the class as torch names it (its nn_module_stack, and Model Explorer's own adapter's layers)
        info = graph.modules.get(c.path)
        cls = (info.qualname or info.cls) if info is not None else ""
        attrs = {"module": bounded(c.path, 2000), "class": bounded(cls, 2000), "call": str(c.index + 1),
                 "ops": str(len(c.nodes))}
        if stats.get(c.path, {}).get("params"):
            attrs["params"] = str(stats[c.path]["params"])
        for spec in shown.values():
            v = (spec.get("modules") or {}).get(c.id)
            if v is not None:
                attrs[str(spec.get("label"))] = format_value(spec, v)
        groups[spaces[id(c)]] = attrs
    return {"graphs": [{"id": bounded(graph.name or "graph", MAX_ID), "nodes": nodes, "groupNodeAttributes": groups}]}


def _attrs(n: Node, shown: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    out = [_kv("name", n.name), _kv("kind", n.kind)]
    if n.target:
        out.append(_kv("target", n.target))
    if n.stack:
        out.append(_kv("module", n.module))
    if n.source is not None:
        out.append(_kv("source", f"{n.source.file}:{n.source.line}" + (f"  {n.source.code}" if n.source.code else "")))
    for key, value in n.attrs.items():
        out.append(_kv(f"attr: {key}", value))
    if n.error is not None:
        out.append(_kv("error", n.error))
    for spec in shown.values():
        v = (spec.get("nodes") or {}).get(n.name)
        if v is not None:
            out.append(_kv(str(spec.get("label")), format_value(spec, v)))
    return out


def node_data(graph: Graph) -> dict[str, dict[str, Any]]:
    """Each overlay as Model Explorer node data (``GraphNodeData``), by overlay name: numbers with a
    gradient from the smallest value to the largest, categories with each category's colour."""
    ids = _ids(graph)
    out: dict[str, dict[str, Any]] = {}
    for name, spec in overlays(graph).items():
        values = {k: v for k, v in (spec.get("nodes") or {}).items() if k in ids and v is not None}
        if not values:
            continue
        if spec.get("kind") == "category":
            colors = category_colors(spec, families=name == "family")
            out[name] = {"results": {ids[k]: {"value": v, "bgColor": colors.get(v, "#9e9e9e")}
                                     for k, v in values.items()}}
        else:
            out[name] = {"results": {ids[k]: {"value": v} for k, v in values.items()}, "gradient": GRADIENT}
    return out


def write_model_explorer(graph: Graph, path: str | os.PathLike[str]) -> list[Path]:
    """Write the graph JSON to ``path`` and each overlay's node data next to it
    (``g.json`` -> ``g.nodedata.flops.json``); the paths written, the graph's first."""
    out = Path(path)
    write_text(out, json.dumps(to_model_explorer(graph), ensure_ascii=False), what="Model Explorer graph")
    written = [out]
    stem = out.name[: -len(out.suffix)] if out.suffix else out.name
    for name, data in node_data(graph).items():
        safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)[:60] or "overlay"
        target = out.with_name(f"{stem}.nodedata.{safe}.json")
        write_text(target, json.dumps(data, ensure_ascii=False), what="Model Explorer node data")
        written.append(target)
    return written
