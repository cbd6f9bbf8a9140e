"""Static images through Graphviz (``dot``, via pygraphviz): DOT text, SVG, PNG, PDF.

Modules become clusters down to ``depth`` (top-level modules have depth 1); a module deeper than
that is one box, and so are each module's plumbing ops (:mod:`fxviz.passes.plumbing`; ``plumbing=True``
draws them) and the outputs of one container (a cache), as in the report. A region that ran inside a
higher-order op (``no_grad``, a ``cond`` branch) is a dashed cluster labelled ``◇ no_grad`` inside its
module's. A run of folded repeats (``h.0-11 ×12``) is one cluster holding the first member
only: the other members are drawn through it, so a 48-layer model stays one block tall. Labels,
kinds and colours come from :mod:`fxviz.render.view`, like the HTML report.

Graphviz reads no token longer than 16K characters and no control characters in XML output, so ids
and label lines are cleaned and cut (:data:`MAX_LABEL`; the report and the JSON keep the full text),
and clusters nest at most :data:`MAX_CLUSTERS` deep (deeper modules are drawn as one box).

    >>> print(to_dot(graph, depth=1)[:40])
    digraph CoolCNN {
    >>> write_image(graph, "model.svg", depth=2)
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fxviz.errors import RenderError
from fxviz.ir import Graph, Node
from fxviz.render.view import (
    ERROR_COLOR,
    KIND_COLORS,
    Group,
    ModuleBoxes,
    edge_label,
    format_count,
    module_boxes,
    node_color,
    node_label,
    text_color,
)
from fxviz.render.view import MAX_LABEL as VIEW_MAX_LABEL
from fxviz.text import clean

if TYPE_CHECKING:
    import pygraphviz

__all__ = ["FORMATS", "to_dot", "write_image"]

#: Output formats ``write_image`` knows, by file suffix.
FORMATS: tuple[str, ...] = ("svg", "png", "pdf", "dot")
_INSTALL_HINT = 'needs pygraphviz and the Graphviz library: see README "Install"'
#: Characters of one label line, and of a node id, that reach Graphviz.
MAX_LABEL = VIEW_MAX_LABEL
#: Clusters nest at most this deep; a module below is one box, like a module past ``depth``.
MAX_CLUSTERS = 32


def _pygraphviz(what: str) -> Any:
    try:
        import pygraphviz
    except ImportError as e:
        raise RenderError(f"{what} {_INSTALL_HINT} ({e})") from e
    return pygraphviz


#: Graphviz writes a string of these characters unquoted, as a number, and cannot read ``-.`` back.
_NUMERAL = re.compile(r"[-.0-9]+")


def _cut(s: str, limit: int = MAX_LABEL) -> str:
    """``s`` cleaned and cut to ``limit`` characters, and quoted when Graphviz writes it."""
    s = clean(s, newlines=False)
    s = s if len(s) <= limit else s[: limit - 1] + "…"
    return s + " " if _NUMERAL.fullmatch(s) else s


def _plain(s: str) -> bool:
    """Is ``s`` an id Graphviz writes and reads back as it is?"""
    return len(s) < MAX_LABEL and s.isprintable() and "\\" not in s


def _text(s: str) -> str:
    """A label Graphviz shows as written: cleaned and cut to :data:`MAX_LABEL`; backslashes are
    escapes in DOT labels, and a label that looks like ``<...>`` would be read as an HTML label."""
    return _not_html(_cut(s).replace("\\", "\\\\"))


def _not_html(s: str) -> str:
    return s + " " if s.startswith("<") and s.endswith(">") else s


def _lines(lines: list[str]) -> str:
    """Several label lines, each shown as written, joined by DOT's centred line break."""
    return _not_html("\\n".join(_text(line) for line in lines if line))


def _aliases(graph: Graph, boxes: ModuleBoxes) -> dict[str, str]:
    """Nodes of the 2nd…Nth member of each folded run -> the node at the same position in the
    first member (the fold pass guarantees members have the same structure). One walk up from
    each node: the members of one run are siblings, so a node is inside at most one of them."""
    runs = {m for ms in boxes.members.values() for m in ms}
    per_member: dict[str, list[str]] = {}
    if runs:
        for n in graph.nodes:
            for gid in boxes.ancestors(boxes.node_group.get(n.name)):
                if gid in runs:
                    per_member.setdefault(gid, []).append(n.name)
    out: dict[str, str] = {}
    for members in boxes.members.values():
        first = per_member.get(members[0], [])
        for m in members[1:]:
            for a, b in zip(per_member.get(m, []), first, strict=False):  # equal by the fold pass
                out[a] = b
    return out


def _build(graph: Graph, depth: int | None, what: str, plumbing: bool = False) -> pygraphviz.AGraph:
    pgv = _pygraphviz(what)
    # a cache's outputs are one box, and each module's plumbing, as in the report
    boxes = module_boxes(graph, group_values=True, plumbing=not plumbing)
    stats = graph.annotations.get("stats", {}).get("modules", {})
    alias = _aliases(graph, boxes)
    run_of_member = {m: rid for rid, ms in boxes.members.items() for m in ms}
    first_member = {rid: ms[0] for rid, ms in boxes.members.items()}
    gids = list(boxes.groups)
    gnum = {gid: i for i, gid in enumerate(gids)}
    # a name Graphviz would have to escape or cut gets an id by position: "L" ids cannot meet "n"
    # (names) or "g" (boxes) ones
    nid = {n.name: f"n{n.name}" if _plain(n.name) else f"L{i}" for i, n in enumerate(graph.nodes)}
    failed = {g for x in graph.nodes if x.error is not None for g in boxes.ancestors(boxes.node_group.get(x.name))}

    def collapsed(gid: str, level: int) -> bool:
        g = boxes.groups[gid]
        return g.kind in ("values", "plumbing") or (depth is not None and g.depth > depth) or level >= MAX_CLUSTERS

    def place(name: str) -> tuple[str, str | None]:
        """(id of what stands for node ``name``, id of the box it is drawn in)."""
        chain = list(reversed(boxes.ancestors(boxes.node_group.get(name))))
        cluster: str | None = None
        for level, gid in enumerate(chain):
            if collapsed(gid, level):
                return f"g{gnum[gid]}", cluster
            cluster = gid
        return nid[name], cluster

    if graph.error is not None:
        title = [f"{_cut(graph.name or 'model')} — the model raised during the {_cut(graph.method or '?')} capture",
                 f"graph up to the failing op: {(graph.error.strip().splitlines() or ['error'])[0]}"]
    else:
        title = [f"{_cut(graph.name or 'model')} — captured with {_cut(graph.method or '?')}"]
    A = pgv.AGraph(directed=True, strict=False, name=_text(graph.name or "model"))
    A.graph_attr.update(rankdir="TB", fontname="Helvetica", fontsize="12", label=_lines(title),
                        labelloc="t", nodesep="0.25", ranksep="0.35", compound="true")
    A.node_attr.update(fontname="Helvetica", fontsize="11", shape="box", style="rounded,filled",
                       height="0.3", margin="0.08,0.03")
    A.edge_attr.update(fontname="Helvetica", fontsize="9", color="#8a94a6", fontcolor="#4b5563",
                       arrowsize="0.6")

    subgraphs: dict[str | None, Any] = {None: A}

    def sub(gid: str | None) -> Any:
        missing: list[str] = []  # the boxes around gid not made yet, innermost first
        while gid not in subgraphs:
            assert gid is not None
            missing.append(gid)
            gid = boxes.groups[gid].parent
        parent = subgraphs[gid]
        for gid in reversed(missing):
            g = boxes.groups[gid]
            label = g.label
            if g.run:
                label = f"{g.run['label']} ×{g.run['count']}" + (f" {g.cls}" if g.cls else "")
            region = g.kind == "region"  # what a higher-order op wrapped: no_grad, a cond branch
            parent = subgraphs[gid] = parent.add_subgraph(
                name=f"cluster_{gnum[gid]}", label=_text(f"◇ {label}" if region else label), labeljust="l",
                style="rounded,dashed" if g.run or region else "rounded",
                color="#5c6bc0" if region else "#9aa3b2", fontsize="11")
        return parent

    def owner(gid: str | None) -> str | None:
        """The cluster a box is drawn in: a run member other than the first is drawn through it."""
        if gid is not None and gid in run_of_member and first_member[run_of_member[gid]] != gid:
            return run_of_member[gid]
        return gid

    drawn: set[str] = set()
    for n in graph.nodes:
        if n.name in alias:
            continue
        key, cluster = place(n.name)
        if key in drawn:
            continue
        drawn.add(key)
        if not key.startswith("g"):
            sub(cluster).add_node(key, **_node_attrs(n))
        else:
            gid = gids[int(key[1:])]
            g = boxes.groups[gid]
            if g.kind in ("values", "plumbing"):
                sub(owner(cluster) if cluster else None).add_node(key, **_box_attrs(g))
                continue
            paths = g.run["paths"] if g.run else [g.path] if g.kind == "module" else []
            params = sum(stats.get(p, {}).get("params", 0) for p in paths)
            lines = [f"{g.run['label']} ×{g.run['count']}", g.cls] if g.run else [g.label]
            if params:
                lines.append(f"{format_count(params)} params")
            err = gid in failed
            sub(owner(cluster) if cluster else None).add_node(
                key, label=_lines(lines), shape="box3d" if g.run else "box", style="filled",
                fillcolor="#eef1f6", color=ERROR_COLOR if err else "#37474f",
                penwidth="2.5" if err else "1")

    seen: set[tuple[str, str]] = set()
    for n in graph.nodes:
        for r in n.inputs:
            if _crosses_members(boxes, run_of_member, r.node, n.name):
                continue
            src, _ = place(alias.get(r.node, r.node))
            dst, _ = place(alias.get(n.name, n.name))
            if src == dst or (src, dst) in seen:
                continue
            seen.add((src, dst))
            A.add_edge(src, dst, label=_text(edge_label(graph.meta_of(r))))
    return A


def _crosses_members(boxes: ModuleBoxes, run_of_member: dict[str, str], a: str, b: str) -> bool:
    """True for an edge between two different members of one run (``h.3`` -> ``h.4``): drawn
    through the first member it would loop back into itself."""
    ma = next((g for g in boxes.ancestors(boxes.node_group.get(a)) if g in run_of_member), None)
    mb = next((g for g in boxes.ancestors(boxes.node_group.get(b)) if g in run_of_member), None)
    return ma is not None and mb is not None and ma != mb and run_of_member[ma] == run_of_member[mb]


def _box_attrs(g: Group) -> dict[str, str]:
    """A box drawn as one node: a container of the model's inputs or outputs (an oval, like one of
    them), or a module's plumbing (muted)."""
    if g.kind == "values":
        color = KIND_COLORS[g.values]
        return {"label": _lines([g.label, f"{g.size} {g.values}s"]), "shape": "oval", "style": "filled",
                "fillcolor": color, "fontcolor": text_color(color), "color": color, "penwidth": "2"}
    return {"label": _lines([g.label]), "shape": "box", "style": "rounded,dashed,filled", "fillcolor": "#f3f3f3",
            "color": "#9e9e9e", "fontcolor": "#616161", "fontsize": "9"}


def _node_attrs(n: Node) -> dict[str, str]:
    color = node_color(n)
    attrs: dict[str, str] = {"label": _text(node_label(n)), "tooltip": _text(n.name)}
    if n.kind == "op":
        attrs.update(fillcolor=color, fontcolor=text_color(color), color=color)
    elif n.kind in ("parameter", "buffer", "constant"):
        shape = n.meta.shape_str() if n.meta is not None else ""
        attrs.update(label=_lines([node_label(n), shape]), style="rounded,dashed,filled",
                     fillcolor="#f6f1ee", color=color, fontcolor=color, fontsize="9")
    else:  # input, output
        attrs.update(shape="oval", fillcolor=color, fontcolor=text_color(color), color=color, penwidth="2")
    if n.attrs.get("data_dependent"):
        attrs.update(style="rounded,dashed,filled", penwidth="2.5")  # not colour alone
    if n.error is not None:
        attrs.update(color=ERROR_COLOR, penwidth="3.5", fillcolor=ERROR_COLOR, fontcolor="white", shape="octagon",
                     tooltip=_text(f"{n.name} raised: {n.error}"))
    return attrs


def to_dot(graph: Graph, *, depth: int | None = None, plumbing: bool = False) -> str:
    """The graph as DOT text: modules as clusters down to ``depth`` (``None``: all of them); each
    module's plumbing one box unless ``plumbing``."""
    return str(_build(graph, depth, "to_dot", plumbing).to_string())


def write_image(
    graph: Graph,
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    depth: int | None = None,
    plumbing: bool = False,
) -> Path:
    """Write the graph as an image; ``format`` (svg, png, pdf, dot) defaults to ``path``'s suffix.

    Raises :class:`~fxviz.errors.RenderError` for an unknown format, a missing pygraphviz or
    Graphviz, or a Graphviz failure.
    """
    out = Path(path)
    fmt = (format or out.suffix.lstrip(".")).lower()
    if fmt not in FORMATS:
        raise RenderError(
            f"cannot tell the image format of {os.fspath(path)!r}: use a suffix or format= "
            f"among {', '.join(FORMATS)}"
        )
    what = f"to_{fmt}"
    A = _build(graph, depth, what, plumbing)
    try:
        if fmt == "dot":
            out.write_text(A.to_string(), encoding="utf-8")
        else:
            A.draw(str(out), format=fmt, prog="dot")
    except (OSError, ValueError) as e:
        hint = _INSTALL_HINT if "not found" in str(e).lower() else "check that the path is writable"
        raise RenderError(f"{what} could not write {os.fspath(path)!r} ({e}): {hint}") from e
    return out
