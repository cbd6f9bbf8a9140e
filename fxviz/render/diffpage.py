"""The diff page: both graphs of a :class:`~fxviz.graphdiff.result.Diff` side by side in one
self-contained HTML page, drawn by the report's own script (``web/src/diffview.js``). Every way to
look at a diff gets this page: ``fxviz diff --html``, ``fxviz passes --before-after``,
``Diff.to_html()`` and a notebook cell showing ``fxviz.compare(...)``. No torch.

:func:`diff_view_model` is the data the page's script draws: each graph's view-model
(:func:`fxviz.render.viewmodel.view_model`) with a category overlay ``diff`` (matched, differs, only in
one side, decomposed, ...) so that the colouring is the overlay mechanism (matched muted, every
difference in colour), the pairs of nodes and of boxes the alignment found (selecting a node
selects its pair, expanding a box expands its pair), each side's capture in words, and every
difference in words with the nodes it names on each side, the box of its module call on each
side, and its source line; and, as on every analysis page (:mod:`fxviz.render.panels`), the
diff's answer in words (``analysis``: the terminal's sentence,
:meth:`~fxviz.graphdiff.result.Diff.headline`) and the differences as the drawer's table
(``panels``), the page's one list of them: each row selects both sides, its cell of one side's
nodes that side's node, and a long explanation (a failed capture's exception) is in the details. When one capture failed (export on data-dependent
control flow), the other side is drawn whole, every op "only in" it, and ``failure`` names the
node where the forward left the graph.
Everything is addressed by index, so the page grows linearly with the nodes and the nesting.
"""

from __future__ import annotations

import os
from typing import Any

from fxviz.calls import Stack
from fxviz.graphdiff.result import Diff
from fxviz.ir import Graph, SourceLoc
from fxviz.render.files import write_text
from fxviz.render.html import in_frame, json_for_script, page
from fxviz.render.panels import cell_text
from fxviz.render.view import bounded, module_boxes, node_label
from fxviz.render.viewmodel import VIEW_MODEL_VERSION, view_model

__all__ = ["DIFF_COLORS", "diff_view_model", "differences_panel", "repr_html", "to_html"]

#: Colours of the ``diff`` overlay's categories (row and call statuses). Matched is muted, so that
#: what differs stands out on both sides.
DIFF_COLORS = {
    "matched": "#b0bec5", "differs": "#c62828", "only_in_a": "#ef6c00", "only_in_b": "#1565c0",
    "shape": "#c62828", "dtype": "#ad1457", "decomposed": "#8e24aa",
}
_ROW_WORDS = {"same": "matched", "shape": "shape differs", "dtype": "dtype differs"}


def _source(src: SourceLoc | None) -> list[Any] | None:
    return [src.file, src.line, src.func, src.code] if src is not None else None


def _diff_overlay(d: Diff, side: str) -> dict[str, Any]:
    """The ``diff`` overlay of one side: each node's row status, each module call's status."""
    g = d.a if side == "a" else d.b
    tree = g.calls
    nodes: dict[str, str] = {}
    modules: dict[str, str] = {}
    for m in d.modules:
        for r in m.rows:
            status = "matched" if r.status == "same" else r.status
            for name in (r.a if side == "a" else r.b):
                nodes[name] = status
        call = tree.by_stack.get(m.stack)
        if call is not None and call.stack:
            modules[call.id] = m.status
    if d.failure("a" if side == "b" else "b") is not None:  # the other side was not captured
        own = "only_in_b" if side == "b" else "only_in_a"
        for n in g.ops:
            nodes.setdefault(n.name, own)
    used = dict.fromkeys([*nodes.values(), *modules.values()])
    if set(used) - {"matched"}:  # a box that holds what differs and what matched is "differs"
        used["differs"] = None
    categories = {k: {"label": _ROW_WORDS.get(k) or d.describe(k), "color": DIFF_COLORS.get(k, "#9e9e9e")}
                  for k in used}
    return {"label": "diff", "kind": "category", "categories": categories, "nodes": nodes, "modules": modules,
            "mixed": "differs",
            "description": f"how each op and module call of {d.labels[0 if side == 'a' else 1]} fared "
                           f"against {d.labels[1 if side == 'a' else 0]}"}


def diff_view_model(d: Diff) -> dict[str, Any]:
    """``{"v", "diff": {"analysis", "panels", "labels", "a", "b", "pairs", "groupPairs",
    "differences", "summary", "failure", "captures"}}``: the data of the diff page (see the module docstring). ``pairs`` are
    the alignment's rows, node index in ``a`` against node index in ``b``; each difference's
    ``at`` is the box of its module call on each side (``None``: the model's own forward, or a
    call that side does not have)."""
    sides = {}
    for key, g in (("a", d.a), ("b", d.b)):
        sides[key] = view_model(g, overlay="diff", extra={"diff": _diff_overlay(d, key)})
    index = {key: {n.name: i for i, n in enumerate(g.nodes)} for key, g in (("a", d.a), ("b", d.b))}
    boxes = (_Boxes(d.a), _Boxes(d.b))
    pairs: list[list[int]] = []
    for m in d.modules:
        for r in m.rows:
            if r.a and r.b:
                ia, ib = [index["a"][x] for x in r.a], [index["b"][x] for x in r.b]
                pairs.extend([x, ib[0]] for x in ia)
                pairs.extend([ia[0], y] for y in ib[1:])
    differences = []
    for x in d.differences:
        differences.append({
            "id": x.id, "kind": x.kind, "words": d.describe(x.kind), "message": x.message, "detail": x.detail,
            "informational": x.informational, "module": x.module, "call": x.call,
            "a": [index["a"][n] for n in (x.a.nodes if x.a else ()) if n in index["a"]],
            "b": [index["b"][n] for n in (x.b.nodes if x.b else ()) if n in index["b"]],
            "source": _source(x.source), "at": [boxes[0].of(x.stack), boxes[1].of(x.stack)],
        })
    failure = None
    for key, other in (("a", "b"), ("b", "a")):
        attempt = d.failure(key)
        if attempt is not None:
            site = next((dd for dd in differences if dd["kind"] == "capture_failed" and dd[other]), None)
            failure = {"side": key, "label": d.labels[0 if key == "a" else 1], "method": attempt.method,
                       "reason": attempt.reason(), "at": site[other] if site else [], "on": other}
    informational = d.summary(informational=True)
    analysis: dict[str, Any] = {"text": bounded(d.headline(), 600),
                                "lv": "error" if d.one_sided else "warn" if d.significant else "ok"}
    panels = [differences_panel((d.a, d.b), d.labels, differences)] if differences else []
    if panels:
        analysis["p"] = panels[0]["name"]
    return {"v": VIEW_MODEL_VERSION, "diff": {
        "analysis": analysis, "panels": panels,
        "labels": list(d.labels), "a": sides["a"], "b": sides["b"], "pairs": pairs,
        "groupPairs": _group_pairs(d, boxes), "differences": differences, "failure": failure,
        "captures": [{"method": g.method, "ops": len(g.ops), "seconds": d.seconds.get(key), "failed": _failed_attempts(g)}
                     for key, g in (("a", d.a), ("b", d.b))],
        "summary": {
            "significant": len(d.significant), "informational": len(d.informational),
            "kinds": [{"kind": k, "words": d.describe(k), "count": n, "informational": informational.get(k, 0)}
                      for k, n in d.summary().items()],
            "statuses": {d.describe(s): n for s, n in sorted(d.status_counts().items())},
            "seconds": {k: round(v, 4) for k, v in d.seconds.items()},
        },
    }}


def differences_panel(graphs: tuple[Graph, Graph], labels: tuple[str, str] | list[str],
                      differences: list[dict[str, Any]]) -> dict[str, Any]:
    """The differences (as :func:`diff_view_model` lists them, on the sides ``graphs``, named
    ``labels``) as the analysis drawer's table, in the shape of every analysis page's
    (:func:`fxviz.render.panels.panel_view`): one row per difference, which shows it on both
    sides when clicked (its ``key``, ``d<k>``: the page's script shows difference ``k``), whose
    cell of one side's nodes shows it on that side (``ck``: ``d<k>:a``), whose facts the details
    of each node it names list (``at``: ``a:n<i>`` and ``b:n<i>``; on a side without a node of
    it, the box of its module call there, ``a:g<i>``) with its ``detail``, if any."""
    by_side = {"a": graphs[0], "b": graphs[1]}

    def nodes(side: str, ids: list[int]) -> str:
        if not ids:
            return ""
        more = f" +{len(ids) - 1}" if len(ids) > 1 else ""
        return node_label(by_side[side].nodes[ids[0]]) + more

    rows = []
    for k, x in enumerate(differences):
        module = (x["module"] + (f" call {x['call'] + 1}" if x["call"] else "")) if x["module"] else "(model)"
        src = x["source"]
        line = f"{str(src[0]).rsplit('/', 1)[-1]}:{src[1]}" if src else ""
        at = [f"{side}:n{i}" for side in ("a", "b") for i in x[side]]
        at += [f"{side}:g{box}" for side, box in zip(("a", "b"), x["at"], strict=True) if not x[side] and box is not None]
        row: dict[str, Any] = {
            "c": [cell_text(c) for c in (x["words"], x["message"], nodes("a", x["a"]), nodes("b", x["b"]), module, line)],
            "ck": [None, None, f"d{k}:a" if x["a"] else None, f"d{k}:b" if x["b"] else None, None, None],
            "key": f"d{k}", "at": at, "lv": "info" if x["informational"] else "warn"}
        if x.get("detail"):
            row["detail"] = bounded(str(x["detail"]), 4000)
        rows.append(row)
    return {"name": "differences", "title": "differences",
            "note": "a row shows its difference on both sides, a side's nodes that side; the grey ones are "
                    "informational (decompositions, symbolic sizes)",
            "columns": ["difference", "what", *(bounded(label, 60) for label in labels), "module", "line"], "rows": rows}


class _Boxes:
    """One side's boxes as the page numbers them, and the box of each module call by its stack."""

    def __init__(self, g: Graph) -> None:
        tree = g.calls
        self.index = {gid: i for i, gid in enumerate(module_boxes(g, group_values=True, tree=tree).groups)}
        self.by_stack = {c.stack: c.id for c in tree.walk() if c.stack}

    def of(self, stack: Stack) -> int | None:
        gid = self.by_stack.get(stack)
        return self.index.get(gid) if gid is not None else None


def _group_pairs(d: Diff, boxes: tuple[_Boxes, _Boxes]) -> list[list[int]]:
    """Boxes of ``a`` and ``b`` that stand for the same thing: the same module call (by its stack),
    its plumbing, the same folded run, the same container of inputs or outputs."""
    ia, ib = boxes[0].index, boxes[1].index
    out = []
    for m in d.modules:
        ga, gb = boxes[0].by_stack.get(m.stack), boxes[1].by_stack.get(m.stack)
        if ga is not None and gb is not None:
            out.append([ia[ga], ib[gb]])
            if f"plumbing:{ga}" in ia and f"plumbing:{gb}" in ib:
                out.append([ia[f"plumbing:{ga}"], ib[f"plumbing:{gb}"]])
    for gid, i in ia.items():
        if gid.startswith(("run:", "outputs:", "inputs:")) or gid == "plumbing:":
            j = ib.get(gid)
            if j is not None:
                out.append([i, j])
    return out


def _failed_attempts(g: Graph) -> list[str]:
    """Each reason a capture failed, once, with the methods that failed for it: a retry that
    fails the same way (export with symbolic sizes, then static) is not a second message."""
    methods: dict[str, list[str]] = {}
    for a in g.attempts:
        if not a.ok:
            methods.setdefault(a.reason(), []).append(a.method)
    return [f"{', '.join(ms)}: {reason}" for reason, ms in methods.items()]


def to_html(d: Diff, path: str | os.PathLike[str] | None = None) -> str:
    """The diff page as one self-contained HTML string; written to ``path`` when given."""
    name = d.a.name or d.b.name or "model"
    data = diff_view_model(d)
    heading = f"{name}: {d.labels[0]} vs {d.labels[1]}"
    text = page(json_for_script(data), title=f"{heading} — fxviz", heading=heading,
                analysis=data["diff"]["analysis"], panels=data["diff"]["panels"])
    if path is not None:
        write_text(path, text, what="diff report")
    return text


def repr_html(d: Diff, *, height: int = 640) -> str:
    """The diff page for a notebook cell (``Diff._repr_html_``), isolated in an iframe as a graph's
    report is (:func:`fxviz.render.html.repr_html`)."""
    return in_frame(to_html(d), height=height)
