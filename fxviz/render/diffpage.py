"""The diff page: both graphs of a :class:`~fxviz.graphdiff.result.Diff` in one self-contained HTML
page. No torch.

:func:`diff_view_model` is the data the page's script draws (the report's viewer, side by side):
each graph's view-model (:func:`fxviz.render.html.view_model`) with a category overlay ``diff``
(matched, differs, only in one side, decomposed, ...) so that the colouring is the overlay
mechanism, the pairs of nodes and of boxes the alignment found (expanding a box expands its
pair), and every difference in words with the nodes it names on each side and its source line.
When one capture failed (export on data-dependent control flow), the other side is drawn whole,
every op "only in" it, and ``failure`` names the node where the forward left the graph.

:func:`html_context` is the same diff as the table the page shows without a script: one section
per module call, aligned rows of ops. Everything is addressed by index, and every label is
bounded, so the page grows linearly with the nodes and the nesting (a call's id written in full
would grow with the square of its depth, once per section and per row).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from fxviz.graphdiff.parts import ModuleDiff
from fxviz.graphdiff.result import Diff
from fxviz.ir import Graph, Node, SourceLoc
from fxviz.render.files import write_text
from fxviz.render.html import VIEW_MODEL_VERSION, view_model
from fxviz.render.view import KIND_COLORS, bounded, edge_label, module_boxes, node_color, node_label

__all__ = ["DIFF_COLORS", "diff_view_model", "html_context", "to_html"]

#: Colours of the ``diff`` overlay's categories (row and call statuses).
DIFF_COLORS = {
    "matched": "#2e7d32", "differs": "#c62828", "only_in_a": "#ef6c00", "only_in_b": "#1565c0",
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
    categories = {k: {"label": _ROW_WORDS.get(k) or d.describe(k), "color": DIFF_COLORS.get(k, "#9e9e9e")}
                  for k in used}
    return {"label": "diff", "kind": "category", "categories": categories, "nodes": nodes, "modules": modules,
            "description": f"how each op and module call of {d.labels[0 if side == 'a' else 1]} fared "
                           f"against {d.labels[1 if side == 'a' else 0]}"}


def diff_view_model(d: Diff) -> dict[str, Any]:
    """``{"v", "diff": {"labels", "a", "b", "pairs", "groupPairs", "differences", "summary",
    "failure"}}``: the data of the diff page (see the module docstring)."""
    sides = {}
    for key, g in (("a", d.a), ("b", d.b)):
        sides[key] = view_model(g, overlay="diff", extra={"diff": _diff_overlay(d, key)})
    index = {key: {n.name: i for i, n in enumerate(g.nodes)} for key, g in (("a", d.a), ("b", d.b))}
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
            "source": _source(x.source),
        })
    failure = None
    for key, other in (("a", "b"), ("b", "a")):
        attempt = d.failure(key)
        if attempt is not None:
            site = next((dd for dd in differences if dd["kind"] == "capture_failed" and dd[other]), None)
            failure = {"side": key, "label": d.labels[0 if key == "a" else 1], "method": attempt.method,
                       "reason": attempt.reason(), "at": site[other] if site else [], "on": other}
    informational = d.summary(informational=True)
    return {"v": VIEW_MODEL_VERSION, "diff": {
        "labels": list(d.labels), "a": sides["a"], "b": sides["b"], "pairs": pairs,
        "groupPairs": _group_pairs(d), "differences": differences, "failure": failure,
        "summary": {
            "significant": len(d.significant), "informational": len(d.informational),
            "kinds": [{"kind": k, "words": d.describe(k), "count": n, "informational": informational.get(k, 0)}
                      for k, n in d.summary().items()],
            "statuses": {d.describe(s): n for s, n in sorted(d.status_counts().items())},
            "seconds": {k: round(v, 4) for k, v in d.seconds.items()},
        },
    }}


def _group_pairs(d: Diff) -> list[list[int]]:
    """Boxes of ``a`` and ``b`` that stand for the same thing: the same module call (by its stack),
    its plumbing, the same folded run, the same container of inputs or outputs."""
    index: list[dict[str, int]] = []
    by_stack: list[dict[Any, str]] = []
    for g in (d.a, d.b):
        tree = g.calls
        index.append({gid: i for i, gid in enumerate(module_boxes(g, group_values=True, tree=tree).groups)})
        by_stack.append({c.stack: c.id for c in tree.walk() if c.stack})
    out = []
    for m in d.modules:
        ga, gb = by_stack[0].get(m.stack), by_stack[1].get(m.stack)
        if ga is not None and gb is not None:
            out.append([index[0][ga], index[1][gb]])
            if f"plumbing:{ga}" in index[0] and f"plumbing:{gb}" in index[1]:
                out.append([index[0][f"plumbing:{ga}"], index[1][f"plumbing:{gb}"]])
    for gid, i in index[0].items():
        if gid.startswith(("run:", "outputs:", "inputs:")) or gid == "plumbing:":
            j = index[1].get(gid)
            if j is not None:
                out.append([i, j])
    return out


# ---- the page without a script: one table per module call --------------------------------------------

_TEMPLATES = Path(__file__).parent / "templates"
# by row status (fxviz.graphdiff.parts.ROW_STATUSES)
_ROW_COLORS = {
    "same": "", "only_in_a": "#fff3cd", "only_in_b": "#fff3cd", "shape": "#f8d7da", "dtype": "#f8d7da",
    "decomposed": "#e2e3f3",
}


@lru_cache(maxsize=1)
def _template() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_TEMPLATES)), autoescape=True, trim_blocks=True, lstrip_blocks=True,
    )
    return env.get_template("diff.html.j2")


def _cell(g: Graph, names: tuple[str, ...]) -> list[dict[str, str]]:
    out = []
    for name in names:
        n: Node = g.node(name)
        out.append({
            "name": bounded(n.name), "label": node_label(n), "color": node_color(n), "target": bounded(n.target),
            "meta": bounded(", ".join(edge_label(m) for m in n.outputs)),
            "source": bounded(f"{n.source.short()} {n.source.code}") if n.source else "",
        })
    return out


def _seconds(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x * 1e3:.3g} ms" if x < 1 else f"{x:.3g} s"


def _own_rows(d: Diff, m: ModuleDiff) -> list[tuple[tuple[str, ...], tuple[str, ...], str, str]]:
    """The rows of a call, ``(ops of a, ops of b, status, difference id)``: the alignment's, or,
    for a call only one side has (the other was not captured, or never called it), that side's
    own ops, each on a row of its own, so the section shows what ran there."""
    if m.rows:
        return [(r.a, r.b, r.status, r.diff) for r in m.rows]
    if d.failure("a") is not None:
        side = "only_in_b"
    elif d.failure("b") is not None:
        side = "only_in_a"
    elif m.status in ("only_in_a", "only_in_b"):
        side = m.status
    else:
        return []
    call = (d.a if side == "only_in_a" else d.b).calls.by_stack.get(m.stack)
    if call is None:
        return []
    return [((name,), (), side, "") if side == "only_in_a" else ((), (name,), side, "") for name in call.ops]


def _sections(d: Diff) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """One section per module call with its aligned rows, and difference id -> anchor of its row
    (or of its module call's section, for a difference without a row). Anchors are indices, and a
    call is named relative to its parent: a full path or call chain per section would make the
    page grow with the square (the cube) of the nesting."""
    row_of: dict[str, str] = {}
    node_row: dict[tuple[str, str], str] = {}  # (side, node) -> its row
    sections: list[dict[str, Any]] = []
    for i, m in enumerate(d.modules):
        sid = f"m{i}"
        rows = []
        for k, (a, b, status, did) in enumerate(_own_rows(d, m)):
            rid = f"{sid}-r{k}"
            node_row.update({("a", x): rid for x in a})
            node_row.update({("b", x): rid for x in b})
            if did:
                row_of.setdefault(did, rid)
            rows.append({
                "id": rid, "status": d.describe(status), "color": _ROW_COLORS.get(status, ""),
                "a": _cell(d.a, a), "b": _cell(d.b, b), "diff": did,
            })
        for did in m.differences:
            row_of.setdefault(did, sid)
        parent = m.stack[-2][0] if len(m.stack) > 1 else ""
        name = m.path[len(parent) + 1:] if parent and m.path.startswith(parent + ".") else m.path
        sections.append({
            "id": sid, "path": bounded(name or d.a.name or d.b.name), "call": m.call, "cls": bounded(m.cls),
            "depth": len(m.stack), "status": m.status, "status_text": d.describe(m.status),
            "ops_a": m.ops_a, "ops_b": m.ops_b, "rows": rows, "notes": m.notes,
            "open": m.status != "matched" and bool(rows or m.differences),
        })
    for x in d.differences:  # a difference without a row of its own links to the row of its node
        if "-r" not in row_of.get(x.id, ""):
            found = next((node_row[(k, n)] for k, side in (("a", x.a), ("b", x.b)) if side is not None
                          for n in side.nodes if (k, n) in node_row), None)
            if found is not None:
                row_of[x.id] = found
    return sections, row_of


def _failed_attempts(g: Graph) -> list[str]:
    """Each reason a capture failed, once, with the methods that failed for it: a retry that
    fails the same way (export with symbolic sizes, then static) is not a second message."""
    methods: dict[str, list[str]] = {}
    for a in g.attempts:
        if not a.ok:
            methods.setdefault(a.reason(), []).append(a.method)
    return [f"{', '.join(ms)}: {reason}" for reason, ms in methods.items()]


def html_context(d: Diff) -> dict[str, Any]:
    """Everything the page shows, as plain data; ``data_json`` is :func:`diff_view_model`, ready to
    embed in a ``<script type="application/json">``."""
    from fxviz.render.html import json_for_script

    sections, anchors = _sections(d)
    diffs = []
    for x in d.differences:
        src = x.source
        diffs.append({
            "id": x.id, "kind": d.describe(x.kind), "message": x.message, "detail": x.detail,
            "informational": x.informational, "module": bounded(x.module) or "(root)", "call": x.call,
            "source": bounded(f"{src.short()}  {src.code}") if src else "", "anchor": anchors.get(x.id, ""),
        })
    informational = d.summary(informational=True)
    name = d.a.name or d.b.name
    return {
        "title": bounded(f"{name}: {d.labels[0]} vs {d.labels[1]}"),
        "labels": [bounded(x) for x in d.labels],
        "sides": [
            {"label": bounded(label), "method": g.method or "–", "ops": len(g.ops), "time": _seconds(d.seconds.get(key)),
             "failed": _failed_attempts(g)}
            for key, g, label in (("a", d.a, d.labels[0]), ("b", d.b, d.labels[1]))
        ],
        "align_time": _seconds(d.seconds.get("align")),
        "summary": [(d.describe(k), n, informational.get(k, 0)) for k, n in d.summary().items()],
        "significant": len(d.significant),
        "informational": len(d.informational),
        "differences": diffs,
        "sections": sections,
        "colors": KIND_COLORS,
        "data_json": json_for_script(diff_view_model(d)),
    }


def to_html(d: Diff, path: str | os.PathLike[str] | None = None) -> str:
    """The diff page as one self-contained HTML string; written to ``path`` when given."""
    text: str = _template().render(**html_context(d))
    if path is not None:
        write_text(path, text, what="diff report")
    return text

