"""The interactive HTML report: one self-contained file, openable offline in any browser.

The graph is turned into a plain JSON view-model here (labels, kinds and colours from
:mod:`fxviz.render.view`, so the report agrees with the tree and the images), embedded in a jinja2
template together with the script bundle built from ``web/`` (``scripts/build_web.sh``). The script
lays the graph out with dagre and draws it; Python decides *what* is shown, the script only *where*.

    >>> html = to_html(graph, "report.html")      # also returns the text
    >>> graph._repr_html_()                        # the same report, isolated in an iframe

Safety: every string from the model (module names, op targets, error messages) reaches the page only
as JSON inside a ``<script type="application/json">`` block, with ``<``, ``>`` and ``&`` escaped, and
the script writes it with ``textContent``; a module named ``</script><img onerror=...>`` shows as text.
"""

from __future__ import annotations

import json
import os
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from fxviz.calls import STATE_KINDS, Call
from fxviz.errors import RenderError
from fxviz.ir import Graph, Node, Ref, SourceLoc, TensorMeta
from fxviz.passes.training import saved_timeline
from fxviz.render.files import write_text
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

__all__ = ["BUNDLE_DIR", "VIEW_MODEL_VERSION", "headline", "in_frame", "json_for_script", "page", "repr_html",
           "split_view_model", "to_html", "view_model"]

#: Where ``scripts/build_web.sh`` writes the bundle (``report.js``, ``report.css``).
BUNDLE_DIR = Path(__file__).parent / "static"
_TEMPLATE_DIR = Path(__file__).parent / "templates"
#: Bumped when the JSON the script reads changes shape.
VIEW_MODEL_VERSION = 4
#: How many boxes and nodes the first view shows at most before leaving modules collapsed.
DEFAULT_BUDGET = 60


def json_for_script(data: Any) -> str:
    """JSON that is safe inside ``<script type="application/json">``: no ``</script>``, no ``<!--``,
    no HTML entities, no JavaScript line separators, whatever the model's names contain."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return (
        text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
        .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    )


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


@lru_cache(maxsize=1)
def _bundle() -> tuple[str, str]:
    js_path, css_path = BUNDLE_DIR / "report.js", BUNDLE_DIR / "report.css"
    if not js_path.is_file() or not css_path.is_file():
        raise RenderError(
            f"the HTML report's script bundle is missing ({js_path}): in a source checkout run "
            "scripts/build_web.sh (Node.js >= 18 and npm); an installed fxviz carries it, so "
            "reinstall it from a wheel or sdist made by `python -m build`"
        )
    js = js_path.read_text(encoding="utf-8")
    if "</script" in js.lower():  # esbuild escapes it; a bundle that does not would end the tag
        raise RenderError(f"{js_path} contains '</script': rebuild it with scripts/build_web.sh")
    return js, css_path.read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_TEMPLATE_DIR)), autoescape=True,
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
    )
    return env.get_template("report.html.j2")


def split_view_model(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The view-model in two parts: what the first view needs, and what only the details panel
    and a change of colouring read (each node's attributes, each box's boundary, the values of
    every overlay but the one the report opens with), ``{"nodes": {"a", "al"}, "boundaries":
    [[ins, outs], ...], "overlays": {name: {"nodes", "groups"}}}``.

    The page writes the second part after the first and draws its first view while it still
    reads it: at 100,000 nodes that is 10 of 19 MB. The script merges it back in when the page
    has read it (``mergeLater`` in ``web/src/model.js``); a page without it has everything in
    the first.
    """
    values = ("nodes", "groups")  # in this order: the file is the same on every run
    later_overlays = {o["name"]: {k: o[k] for k in values} for o in data["overlays"] if o["name"] != data["overlay"]}
    first = {
        **data,
        "nodes": {k: v for k, v in data["nodes"].items() if k not in ("a", "al")},
        "groups": [{k: v for k, v in g.items() if k not in ("ins", "outs")} for g in data["groups"]],
        "overlays": [o if o["name"] not in later_overlays else {k: v for k, v in o.items() if k not in values}
                     for o in data["overlays"]],
    }
    boundaries = [[g.get("ins", []), g.get("outs", [])] for g in data["groups"]]
    attrs = {k: data["nodes"][k] for k in ("a", "al")}
    return first, {"nodes": attrs, "boundaries": boundaries, "overlays": later_overlays}


#: How many rows of each table the page writes as plain HTML (the script draws them all).
STATIC_ROWS = 500


def page(data_json: str, later_json: str = "null", *, title: str, heading: str = "", analysis: dict[str, Any] | None = None,
         panels: list[dict[str, Any]] | None = None, notes: list[str] | None = None) -> str:
    """The report's page (script, styles, the data in its two blocks) around data already made
    safe for a script element (:func:`json_for_script`): a graph's view-model, or the diff page's
    (:mod:`fxviz.render.diffpage`), which the same script draws side by side.

    ``heading`` (what the page is of: the model's name), ``analysis`` and ``panels`` (the
    view-model's answer and tables, :mod:`fxviz.render.panels`; ``notes``, the capture's): the page also writes them as
    plain HTML (escaped), which the script replaces by the
    interactive ones, so that a page whose script is off or failed still says its answer and
    lists its findings (the first :data:`STATIC_ROWS` rows of each table)."""
    js, css = _bundle()
    return _template().render(title=title, data_json=data_json, later_json=later_json, js=js, css=css,
                              heading=heading, analysis=analysis, panels=panels or [], notes=notes or [],
                              static_rows=STATIC_ROWS)


def to_html(
    graph: Graph,
    path: str | os.PathLike[str] | None = None,
    *,
    title: str | None = None,
    budget: int = DEFAULT_BUDGET,
    overlay: str | None = None,
) -> str:
    """Render ``graph`` as one self-contained HTML report; write it to ``path`` if given.

    ``budget`` is how many boxes and nodes the first view shows before it leaves modules
    collapsed (the user expands the rest); ``overlay`` names the overlay the report opens coloured
    by (``"flops"``, ``"params"``; :mod:`fxviz.passes.overlays`). Returns the HTML text. Raises
    :class:`~fxviz.errors.RenderError` when the script bundle was not built, ``overlay`` is not one
    of the graph's, or ``path`` cannot be written.
    """
    first, later = split_view_model(view_model(graph, budget=budget, overlay=overlay))
    text = page(json_for_script(first), json_for_script(later), title=title or f"{graph.name or 'model'} — fxviz",
                heading=graph.name or "model", analysis=first["analysis"], panels=first["panels"], notes=first["notes"])
    if path is not None:
        write_text(path, text, what="HTML report")
    return text


def repr_html(graph: Graph, *, height: int = 640) -> str:
    """The report for a notebook cell (``Graph._repr_html_``): the whole file in an ``<iframe
    srcdoc>``, so two reports in one notebook share no ids, styles or scripts. ``sandbox`` lets
    the script run but gives it no access to the notebook page.

    The attribute is single-quoted and only ``&``, ``'``, ``<`` and ``>`` are escaped: the report is
    mostly JSON, whose double quotes a double-quoted attribute would turn into ``&quot;`` (six
    bytes each), and the notebook file stores the cell as JSON again. This way a displayed report
    adds about 1.1 times the standalone file to the notebook, where full escaping added 1.45."""
    return in_frame(to_html(graph), height=height)


def in_frame(doc: str, *, height: int = 640) -> str:
    """A whole page in an isolated ``<iframe srcdoc>`` for a notebook cell (see :func:`repr_html`)."""
    frame_id = f"fxviz-{uuid.uuid4().hex[:12]}"
    srcdoc = doc.replace("&", "&amp;").replace("'", "&#39;").replace("<", "&lt;").replace(">", "&gt;")
    return (
        f'<iframe id="{frame_id}" class="fxviz-report" sandbox="allow-scripts allow-downloads" '
        f'style="width:100%;height:{int(height)}px;border:1px solid #ccc;border-radius:4px" '
        f"srcdoc='{srcdoc}'></iframe>"
    )
