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

import html as _html
import json
import os
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from fxviz.calls import Call, build_scopes
from fxviz.errors import RenderError
from fxviz.ir import Graph, Node, Ref, Scope, SourceLoc, TensorMeta, module_class
from fxviz.render.files import write_text
from fxviz.render.view import (
    KIND_COLORS,
    Group,
    ModuleBoxes,
    edge_label,
    format_count,
    module_boxes,
    node_color,
    node_label,
    op_kind,
    scope_label,
    stable_color,
)

__all__ = ["BUNDLE_DIR", "VIEW_MODEL_VERSION", "repr_html", "to_html", "view_model"]

#: Where ``scripts/build_web.sh`` writes the bundle (``report.js``, ``report.css``).
BUNDLE_DIR = Path(__file__).parent / "static"
_TEMPLATE_DIR = Path(__file__).parent / "templates"
#: Bumped when the JSON the script reads changes shape.
VIEW_MODEL_VERSION = 2
#: How many boxes and nodes the first view shows at most before leaving modules collapsed.
DEFAULT_BUDGET = 60


def _json_for_script(data: Any) -> str:
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
        self._index: dict[str, int] = {}

    def add(self, item: Any) -> int:
        key = json.dumps(item, sort_keys=True)
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self.items)
            self.items.append(item)
        return i


def _meta_entry(meta: TensorMeta) -> list[Any]:
    return [meta.shape_str(), meta.dtype, edge_label(meta)]


def _source_entry(src: SourceLoc) -> list[Any]:
    return [src.file, src.line, src.func, src.code]


#: Levels of the sidebar's module tree; the page's script draws it with recursion, so deeper
#: modules are summed up by one entry.
TREE_LEVELS = 64


def _tree(graph: Graph, root: Scope, stats: dict[str, Any]) -> dict[str, Any]:
    def entry(scope: Scope) -> dict[str, Any]:
        s = stats.get(scope.path, {})
        return {
            "path": scope.path,
            "label": scope_label(graph, scope),
            "cls": scope.cls,
            "calls": scope.calls,
            "params": s.get("params", 0),
            "pl": format_count(s["params"]) if s.get("params") else "",
            "ops": s.get("ops", 0),
            "c": [],
        }

    top = entry(root)
    todo = [(root, top, 1)]
    while todo:  # no recursion: modules can nest thousands of levels deep
        scope, out, level = todo.pop()
        if level >= TREE_LEVELS and scope.children:
            below = max(s.path.count(".") for s in scope.walk()) - scope.path.count(".")
            first = next(iter(scope.children.values()))
            out["c"] = [{"path": first.path, "label": f"⋯ {below} more levels", "cls": "", "calls": 0,
                         "params": 0, "pl": "", "ops": 0, "c": []}]
            continue
        for child in scope.children.values():
            out["c"].append(entry(child))
            todo.append((child, out["c"][-1], level + 1))
    return top


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
    return out


def view_model(graph: Graph, *, budget: int = DEFAULT_BUDGET) -> dict[str, Any]:
    """The JSON the report's script reads: nodes, module boxes, module tree, capture record.

    Nodes refer to each other, to boxes and to the shape and source tables by index. Each node
    carries its label, op kind, colour, the nodes that read it and the parameters it holds or
    reads, each output its shape, dtype and edge label; each box its counts, whether the failing
    op is inside, and the values that cross its border. The script derives nothing of its own but
    positions (and which boxes are open).
    """
    tree = graph.calls
    boxes = module_boxes(graph, group_values=True, tree=tree)
    calls = {c.id: c for c in tree.walk() if c.stack}
    group_ids = list(boxes.groups)
    gindex = {gid: i for i, gid in enumerate(group_ids)}
    nindex = {n.name: i for i, n in enumerate(graph.nodes)}
    by_name = {n.name: n for n in graph.nodes}
    users = graph.users()
    stats = graph.annotations.get("stats", {})
    mod_stats: dict[str, Any] = stats.get("modules", {})
    metas, sources = _Interner(), _Interner()

    def ref(r: Ref) -> int | list[int]:
        return nindex[r.node] if r.index == 0 else [nindex[r.node], r.index]

    def params_of(n: Node) -> int:
        """A parameter's size, or what an op reads from parameters (each parameter once)."""
        if n.kind == "parameter":
            return (n.meta.numel if n.meta is not None else 0) or 0
        if n.kind != "op":
            return 0
        read = {r.node for r in n.inputs if by_name[r.node].kind == "parameter"}
        return sum(params_of(by_name[p]) for p in read)

    def node_entry(n: Node) -> dict[str, Any]:
        g = boxes.node_group.get(n.name)
        d: dict[str, Any] = {
            "n": n.name, "l": node_label(n), "k": n.kind, "o": op_kind(n), "c": node_color(n),
            "g": gindex[g] if g is not None else -1,
        }
        if n.target:
            d["t"] = n.target
        if n.inputs:
            d["i"] = [ref(r) for r in n.inputs]
        if users[n.name]:
            d["u"] = [nindex[u] for u in users[n.name]]
        if n.outputs:
            d["out"] = [metas.add(_meta_entry(m)) for m in n.outputs]
        if n.source is not None:
            d["s"] = sources.add(_source_entry(n.source))
        if n.attrs:
            d["a"] = n.attrs
        if n.error is not None:
            d["e"] = n.error
        np_ = params_of(n)
        if np_:
            d["np"] = np_
        return d

    failing: set[str] = set()
    for n in graph.nodes:
        if n.error is not None:
            failing.update(boxes.ancestors(boxes.node_group.get(n.name)))
    boundaries = _boundaries(graph, boxes, calls)

    def group_entry(g: Group) -> dict[str, Any]:
        paths = g.run["paths"] if g.run else [g.path] if g.kind == "module" else []
        params = sum(mod_stats.get(p, {}).get("params", 0) for p in paths)
        ops = sum(mod_stats.get(p, {}).get("ops", 0) for p in paths)
        if g.id in boxes.regions:
            ops = len(boxes.regions[g.id].nodes)
        d: dict[str, Any] = {
            "p": gindex[g.parent] if g.parent is not None else -1,
            "l": g.label, "path": g.path, "cls": g.cls, "call": g.call, "d": g.depth,
            "run": g.run["count"] if g.run else 0,
            "params": params, "pl": format_count(params) if params else "", "ops": ops,
            "c": KIND_COLORS[g.values] if g.values else stable_color(g.cls or g.path),
        }
        if g.kind != "module":
            d["k"] = g.kind
        if g.values:
            d.update({"io": g.values, "n": g.size})
        ins, outs = boundaries.get(g.id, ([], []))
        if ins:
            d["ins"] = [ref(r) for r in ins]
        if outs:
            d["outs"] = [ref(r) for r in outs]
        if g.id in failing:
            d["err"] = 1
        return d

    groups = [group_entry(boxes.groups[gid]) for gid in group_ids]
    nodes = [node_entry(n) for n in graph.nodes]
    total_params = stats.get("total_params", 0)
    return {
        "v": VIEW_MODEL_VERSION,
        "name": graph.name,
        "method": graph.method,
        "error": graph.error,
        "attempts": [
            {"method": a.method, "ok": a.ok, "seconds": round(a.seconds, 3), "reason": a.reason(),
             "message": a.message, **({"skipped": True} if a.skipped else {})}
            for a in graph.attempts
        ],
        "notes": list(graph.notes),
        "totals": {
            "params": total_params, "pl": format_count(total_params),
            "ops": stats.get("total_ops", len(graph.ops)), "nodes": len(graph.nodes),
        },
        "budget": budget,
        "kinds": KIND_COLORS,
        "metas": metas.items,
        "sources": sources.items,
        "groups": groups,
        "nodes": nodes,
        # the scope tree from the call tree taken above (Graph.scopes would derive it again)
        "tree": _tree(graph, build_scopes(graph.nodes, graph.modules, graph.name or module_class(graph, ""), tree),
                      mod_stats),
    }


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


def to_html(
    graph: Graph,
    path: str | os.PathLike[str] | None = None,
    *,
    title: str | None = None,
    budget: int = DEFAULT_BUDGET,
) -> str:
    """Render ``graph`` as one self-contained HTML report; write it to ``path`` if given.

    ``budget`` is how many boxes and nodes the first view shows before it leaves modules
    collapsed (the user expands the rest). Returns the HTML text. Raises
    :class:`~fxviz.errors.RenderError` when the script bundle was not built or ``path`` cannot be
    written.
    """
    js, css = _bundle()
    data = view_model(graph, budget=budget)
    text = _template().render(
        title=title or f"{graph.name or 'model'} — fxviz",
        data_json=_json_for_script(data),
        js=js,
        css=css,
    )
    if path is not None:
        write_text(path, text, what="HTML report")
    return text


def repr_html(graph: Graph, *, height: int = 640) -> str:
    """The report for a notebook cell (``Graph._repr_html_``): the whole file in an ``<iframe
    srcdoc>``, so two reports in one notebook share no ids, styles or scripts. ``sandbox`` lets
    the script run but gives it no access to the notebook page."""
    doc = to_html(graph)
    frame_id = f"fxviz-{uuid.uuid4().hex[:12]}"
    return (
        f'<iframe id="{frame_id}" class="fxviz-report" sandbox="allow-scripts allow-downloads" '
        f'style="width:100%;height:{int(height)}px;border:1px solid #ccc;border-radius:4px" '
        f'srcdoc="{_html.escape(doc, quote=True)}"></iframe>'
    )
