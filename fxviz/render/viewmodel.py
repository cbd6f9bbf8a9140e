"""The report's view-model: the graph as the plain JSON the page's script draws (labels, kinds and
colours from :mod:`fxviz.render.view`, so the report agrees with the tree and the images; module
boxes, their boundaries, overlays, panels, phases). Python decides *what* is shown here; the script
(``web/``) only *where*. :mod:`fxviz.render.html` puts it in a page.
"""

from __future__ import annotations

import json
from typing import Any

from fxviz.calls import STATE_KINDS, Call
from fxviz.errors import RenderError
from fxviz.ir import Graph, Node, Ref, SourceLoc, TensorMeta
from fxviz.passes.training import saved_timeline
from fxviz.render.overlays import overlay_view
from fxviz.render.panels import headline_view, panel_view
from fxviz.render.view import (
    ERROR_COLOR,
    KIND_COLORS,
    MAX_LABEL,
    Group,
    ModuleBoxes,
    bounded,
    captured_by,
    edge_label,
    format_count,
    module_boxes,
    node_label,
    node_placement,
    op_kind,
    shared_state,
    stable_color,
    text_color,
)

__all__ = ["DEFAULT_BUDGET", "VIEW_MODEL_VERSION", "headline", "view_model"]

#: Bumped when the JSON the script reads changes shape.
VIEW_MODEL_VERSION = 4
#: How many boxes and nodes the first view shows at most before leaving modules collapsed.
DEFAULT_BUDGET = 60


class _Interner:
    """A table of repeated values (shapes, source lines): nodes refer to them by index, which keeps
    a 48-layer model's report small."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._index: dict[tuple[Any, ...], int] = {}

    def add(self, item: list[Any]) -> int:
        """The index of ``item``, a flat list of strings, numbers and ``None``."""
        key = tuple(item)
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self.items)
            self.items.append(item)
        return i


def _meta_entry(meta: TensorMeta, place: str = "") -> list[Any]:
    """Shape, dtype and edge label of a value; a DTensor's placement with its (global) shape."""
    return [meta.shape_str() + (f" {place}" if place else ""), meta.dtype, edge_label(meta, place)]


def _source_entry(src: SourceLoc) -> list[Any]:
    return [src.file, src.line, src.func, src.code]


def _boundaries(graph: Graph, boxes: ModuleBoxes, calls: dict[str, Call]) -> dict[str, tuple[list[Ref], list[Ref]]]:
    """What each box reads from outside and hands back, ``gid -> (inputs, outputs)``, main
    result first.

    A module call's boundary is its call's (:mod:`fxviz.calls`), the one derivation the terminal
    tree reads too. A run of folded repeats reads what its members read from outside the run and
    hands back what its members hand to a reader outside it. A box of model inputs hands back
    those that are read; a box of model outputs reads what the model returns through it.
    """
    readers: dict[Ref, list[str]] = {}
    position = {n.name: i for i, n in enumerate(graph.nodes)}
    for n in graph.nodes:
        for r in n.inputs:
            readers.setdefault(r, []).append(n.name)
    out: dict[str, tuple[list[Ref], list[Ref]]] = {}
    for gid, g in boxes.groups.items():
        if gid in calls:
            c = calls[gid]
            out[gid] = (c.inputs, c.outputs)
        elif gid in boxes.regions:
            region = boxes.regions[gid]
            out[gid] = (region.inputs, region.outputs)
        elif g.run:
            members = [calls[m] for m in boxes.members[gid] if m in calls]
            inside = {name for m in members for name in m.nodes}
            ins = {r: None for m in members for r in m.inputs if r.node not in inside}
            outs = {r: None for m in members for r in m.outputs
                    if any(u not in inside for u in readers.get(r, ()))}
            out[gid] = (list(ins), sorted(outs, key=lambda r: (-position[r.node], r.index)))
    values: dict[str, tuple[dict[Ref, None], dict[Ref, None]]] = {}
    for n in graph.nodes:
        vid = boxes.node_group.get(n.name)
        if vid is None or not boxes.groups[vid].values:
            continue
        reads, hands = values.setdefault(vid, ({}, {}))
        if n.kind == "output":
            reads.update(dict.fromkeys(n.inputs))
        elif Ref(n.name) in readers:
            hands[Ref(n.name)] = None
    out.update({vid: (list(reads), list(hands)) for vid, (reads, hands) in values.items()})
    out.update(_node_set_boundaries(graph, boxes, readers, position, set(out)))
    return out


def _node_set_boundaries(graph: Graph, boxes: ModuleBoxes, readers: dict[Ref, list[str]], position: dict[str, int],
                         done: set[str]) -> dict[str, tuple[list[Ref], list[Ref]]]:
    """The boundary of every other box (plumbing, regions): what its nodes, at any depth, read
    from outside it (state left out) and hand to a reader outside it, the last made first."""
    inside: dict[str, set[str]] = {}
    for n in graph.nodes:
        for gid in boxes.ancestors(boxes.node_group.get(n.name)):
            if gid not in done:
                inside.setdefault(gid, set()).add(n.name)
    kinds = {n.name: n.kind for n in graph.nodes}
    out: dict[str, tuple[list[Ref], list[Ref]]] = {}
    for gid, names in inside.items():
        ins: dict[Ref, None] = {}
        outs: dict[Ref, None] = {}
        for name in sorted(names, key=position.__getitem__):
            for r in graph.node(name).inputs:
                if r.node not in names and kinds[r.node] not in STATE_KINDS:
                    ins[r] = None
        for name in names:
            for k in range(max(1, len(graph.node(name).outputs))):
                r = Ref(name, k)
                if any(u not in names for u in readers.get(r, ())):
                    outs[r] = None
        out[gid] = (list(ins), sorted(outs, key=lambda r: (-position[r.node], r.index)))
    return out


def view_model(graph: Graph, *, budget: int = DEFAULT_BUDGET, overlay: str | None = None,
               extra: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The JSON the report's script reads: nodes, module boxes, capture record,
    overlays (:mod:`fxviz.render.overlays`, with ``extra`` ones that are not on the graph, such as
    a diff's; the report starts coloured by ``overlay``).

    Nodes refer to each other, to boxes and to the shape and source tables by index. Each node
    carries its label, op kind and family (its colour is the family's, ``kinds``), its inputs and
    the parameters it holds or reads, each output its shape, dtype and edge label (the nodes are
    columns: :func:`_node_columns`); each box its counts, whether the failing
    op is inside, and the values that cross its border. The script derives nothing of its own but
    positions (and which boxes are open).
    """
    tree = graph.calls
    boxes = module_boxes(graph, group_values=True, tree=tree)
    calls = {c.id: c for c in tree.walk() if c.stack}
    group_ids = list(boxes.groups)
    gindex = {gid: i for i, gid in enumerate(group_ids)}
    nindex = {n.name: i for i, n in enumerate(graph.nodes)}
    stats = graph.annotations.get("stats", {})
    mod_stats: dict[str, Any] = stats.get("modules", {})
    metas, sources = _Interner(), _Interner()

    def ref(r: Ref) -> int | list[int]:
        return nindex[r.node] if r.index == 0 else [nindex[r.node], r.index]

    ops, nodes = _node_columns(graph, nindex, {n: gindex[g] for n, g in boxes.node_group.items() if g is not None},
                               ref, metas, sources)

    failing: set[str] = set()
    for n in graph.nodes:
        if n.error is not None:
            failing.update(boxes.ancestors(boxes.node_group.get(n.name)))
    boundaries = _boundaries(graph, boxes, calls)

    shared = shared_state(graph)

    def group_entry(g: Group) -> dict[str, Any]:
        paths = g.run["paths"] if g.run else [g.path] if g.kind == "module" else []
        params = sum(mod_stats.get(p, {}).get("params", 0) for p in paths)
        # the ops this box holds: its call's (a module called three times is three boxes), not
        # its module's, which counts every call
        ops = sum(len(calls[m].nodes) for m in boxes.members.get(g.id, [g.id]) if m in calls)
        if g.kind == "plumbing":
            params, ops = 0, g.size
        if g.id in boxes.regions:
            ops = len(boxes.regions[g.id].nodes)
        d: dict[str, Any] = {
            "p": gindex[g.parent] if g.parent is not None else -1,
            # paths are cut like labels: at depth d a full path is O(d) long, and every box writing
            # its own would make the report grow with the square of the nesting
            "l": g.label, "path": bounded(g.path), "cls": g.cls, "call": g.call, "d": g.depth,
            "run": g.run["count"] if g.run else 0,
            "params": params, "pl": format_count(params) if params else "", "ops": ops,
            "c": KIND_COLORS[g.values] if g.values else _BOX_COLORS.get(g.kind) or stable_color(g.cls or g.path),
        }
        if g.kind != "module":
            d["k"] = g.kind
        if g.values:
            d.update({"io": g.values, "n": g.size})
        elif g.kind == "plumbing":
            d["n"] = g.size
        ins, outs = boundaries.get(g.id, ([], []))
        if ins:
            d["ins"] = [ref(r) for r in ins]
        if outs:
            d["outs"] = [ref(r) for r in outs]
        if g.id in failing:
            d["err"] = 1
        held = [[attr, bounded(graph.node(owner).module), nindex[owner]] for p in paths for attr, owner in shared.get(p, ())]
        if held:
            d["sh"] = held  # [attribute, owner module, owner node]: "weight shared with transformer.wte"
        return d

    groups = [group_entry(boxes.groups[gid]) for gid in group_ids]
    total_params = stats.get("total_params", 0)
    shown = overlay_view(graph, boxes, group_ids, tree, extra)
    if overlay is not None and overlay not in {o["name"] for o in shown}:
        raise RenderError(f"graph {graph.name!r} has no overlay {overlay!r}; it has: "
                          f"{', '.join(o['name'] for o in shown) or 'none'}")
    raised = _raised_attempt(graph)
    return {
        "v": VIEW_MODEL_VERSION,
        "name": graph.name,
        "method": graph.method,
        "captured": captured_by(graph.method),
        "error": graph.error,
        "headline": headline(graph),
        "attempts": [
            {"method": a.method, "ok": a.ok, "seconds": round(a.seconds, 4), "reason": a.reason(),
             "message": a.message, **({"raised": 1} if k == raised else {}),
             **({"skipped": True} if a.skipped else {})}
            for k, a in enumerate(graph.attempts)
        ],
        "notes": list(graph.notes),
        "totals": {
            "params": total_params, "pl": format_count(total_params),
            "ops": stats.get("total_ops", len(graph.ops)), "nodes": len(graph.nodes),
        },
        "budget": budget,
        "kinds": KIND_COLORS,
        "kindText": {k: text_color(c) for k, c in KIND_COLORS.items()},
        "errorColor": ERROR_COLOR,
        "overlays": shown,
        "overlay": overlay,
        "panels": panel_view(graph, nindex, gindex),
        "analysis": headline_view(graph, nindex, gindex),
        **_phases(graph, nindex),
        **({"timeline": {"n": [nindex[n] for n, _ in line], "b": [b for _, b in line]}}
           if (line := saved_timeline(graph)) else {}),
        "metas": metas.items,
        "sources": sources.items,
        "groups": groups,
        "ops": ops,
        "nodes": nodes,
    }


def _node_columns(graph: Graph, nindex: dict[str, int], box_of: dict[str, int], ref: Any,
                  metas: _Interner, sources: _Interner) -> tuple[list[list[Any]], dict[str, Any]]:
    """The nodes as columns, one list per field with one entry per node, and the table of what
    nodes share (kind, op family, label, target), which each node points into: a 100,000-node
    report parses ten lists instead of 100,000 objects, and its file is 40% smaller.

    Columns: ``n`` name, ``g`` innermost box (-1: the model), ``f`` entry of the ``ops`` table
    (``[kind, family, label, target]``, the target ``null`` for none and ``1`` for the node's own
    name: a parameter's), ``ni``/``i`` how many inputs and, all nodes' in a row, each input as a
    value reference (a node index, or ``[node, output]`` for an output other than the first),
    ``no``/``out`` how many outputs and their entries of ``metas``, ``s`` entry of ``sources``
    (-1: none), ``np`` the parameters it holds or reads (each parameter once), ``al`` how long its
    attributes are as JSON text and ``a`` that text, all nodes' in a row (lengths in UTF-16 code
    units, as the script counts; 0: none; the details panel parses a node's own when shown: one
    string, where 90,000 small ones cost the page a 30 ms garbage collection), and ``e``, by node
    index, the error of the op that raised. Readers are not written: they are the inputs read
    the other way, which the script indexes.

    A name longer than a label is cut (it keeps its end and its node index, so it stays unique),
    and so is a state name that is its node's name: the state name of a parameter 2,000 modules
    deep is 12,000 characters, and whole names made the report grow with the square of the
    nesting. An op's target is written whole (once per distinct op, in the table)."""
    table = _Interner()
    by_name = {n.name: n for n in graph.nodes}
    cols: dict[str, list[Any]] = {k: [] for k in ("n", "g", "f", "ni", "i", "no", "out", "s", "np", "al")}
    attrs: list[str] = []
    errors: dict[str, str] = {}

    def params_of(n: Node) -> int:
        """A parameter's size, or what an op reads from parameters (each parameter once)."""
        if n.kind == "parameter":
            return (n.meta.numel if n.meta is not None else 0) or 0
        if n.kind != "op":
            return 0
        read = {r.node for r in n.inputs if by_name[r.node].kind == "parameter"}
        return sum(params_of(by_name[p]) for p in read)

    for k, n in enumerate(graph.nodes):
        name = n.name if len(n.name) <= MAX_LABEL else f"…{n.name[-(MAX_LABEL - 12):]}#{k}"
        target: str | int | None = n.target or None
        if n.target and n.target == n.name:  # a parameter's state name: cut as its name is
            target = 1 if name is n.name else bounded(n.target)
        cols["n"].append(name)
        cols["g"].append(box_of.get(n.name, -1))
        cols["f"].append(table.add([n.kind, op_kind(n), node_label(n), target]))
        cols["ni"].append(len(n.inputs))
        cols["i"].extend(ref(r) for r in n.inputs)
        cols["no"].append(len(n.outputs))
        place = node_placement(n)
        cols["out"].extend(metas.add(_meta_entry(m, place if j == 0 else "")) for j, m in enumerate(n.outputs))
        cols["s"].append(sources.add(_source_entry(n.source)) if n.source is not None else -1)
        cols["np"].append(params_of(n))
        text = json.dumps(n.attrs, ensure_ascii=False, separators=(",", ":")) if n.attrs else ""
        attrs.append(text)
        cols["al"].append(len(text.encode("utf-16-le")) // 2)
        if n.error is not None:
            errors[str(k)] = n.error
    return table.items, {**cols, "a": "".join(attrs), "e": errors}


#: Colours of boxes that are not module calls (a module call's comes from its class).
_BOX_COLORS = {"plumbing": "#9e9e9e", "region": "#546e7a"}


def _phases(graph: Graph, nindex: dict[str, int]) -> dict[str, Any]:
    """``{"phases": {phase: node indices}}`` for the passes other than the forward (the report's
    forward / backward choice, web/src/phase.js); nothing for a forward-only graph."""
    out: dict[str, list[int]] = {}
    for n in graph.nodes:
        if n.phase != "forward":
            out.setdefault(n.phase, []).append(nindex[n.name])
    return {"phases": out} if out else {}


def _raised_attempt(graph: Graph) -> int | None:
    """Index of the attempt in which the model itself raised: the last one, in a partial graph
    (recorded as failed by a capture, as done by graphs saved before that)."""
    return len(graph.attempts) - 1 if graph.partial and graph.attempts else None


def headline(graph: Graph) -> str:
    """One sentence on how the graph was made, for a banner: ``Captured by eager after export,
    fx failed.``, or, when the model itself raised, that it did, where, and what failed before."""
    raised = _raised_attempt(graph)
    failed = [a.method for k, a in enumerate(graph.attempts) if not a.ok and k != raised]
    before = f" Before that, {', '.join(failed)} failed." if failed else ""
    if graph.partial:
        method = graph.attempts[raised].method if raised is not None else graph.method or "?"
        return (f"The model raised during the {method} capture: this is the graph up to the failing op."
                + before)
    if failed:
        return f"Captured by {graph.method or '?'} after {', '.join(failed)} failed."
    return f"Captured by {graph.method or '?'}."
