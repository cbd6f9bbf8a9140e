"""The compile map written onto the eager graph: overlays and panels every renderer shows. No torch.

* overlay ``compiled`` (category): per op the compiled graph that ran it (``g0``, ``g1``, …),
  ``eager``, or ``break`` for the op where the graph broke (``.item()``, ``bool(tensor)``); per
  module call its one graph, ``mixed`` when several graphs or graphs and eager ops ran it, ``eager``;
* overlay ``coverage`` (number, %): per module call the share of its ops (any depth) that ran
  inside a compiled graph;
* panels ``breaks`` (grouped by cause and line, with the hint), ``modules`` (module calls ranked by
  ops left outside graphs) and ``recompiles`` (the guard that failed, and which input set; the
  input sets a function ran eagerly in after Dynamo hit its recompile limit, marked as errors).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fxviz.analyze.compilemap.result import CATEGORIES, BreakGroup, CompileMap, ModuleCoverage, percent
from fxviz.ir import Graph, module_class
from fxviz.passes.overlays import set_overlay
from fxviz.passes.panels import row, set_panel
from fxviz.text import one_line

#: Graph colours, cycled; red stays for eager and breaks.
_PALETTE = ("#4c78a8", "#54a24b", "#72b7b2", "#b279a2", "#f58518", "#9d755d", "#eeca3b", "#1f77b4", "#2ca02c",
            "#17becf")
EAGER, MIXED, BREAK = "eager", "mixed", "break"


def module_coverage(graph: Graph, assigned: Mapping[str, str]) -> list[ModuleCoverage]:
    """Every module call (the model first, then in execution order) with its ops, any depth, and
    how many of them ran inside a compiled graph."""
    out = []
    for call in graph.calls.walk():
        names = [n for n in call.nodes if n in assigned]
        ids = [assigned[n] for n in names]
        graphs = sorted({g for g in ids if g != EAGER}, key=lambda g: int(g[1:]) if g[1:].isdigit() else 0)
        out.append(ModuleCoverage(call.id, call.path, module_class(graph, call.path) or graph.name,
                                  len(names), sum(1 for g in ids if g != EAGER), graphs))
    return out


def write(cmap: CompileMap, *, limit: int = 50) -> Graph:
    """Write the overlays and panels of ``cmap`` on ``cmap.graph`` (replacing earlier ones)."""
    graph = cmap.graph
    node_values: dict[str, str] = dict(cmap.assigned)
    for b in cmap.breaks:
        if b.node is not None and node_values.get(b.node) == EAGER:
            node_values[b.node] = BREAK
    module_values: dict[str, Any] = {}
    share: dict[str, Any] = {}
    for m in cmap.modules:
        if not m.ops:
            continue
        if m.compiled == 0:
            module_values[m.call] = EAGER
        elif m.compiled == m.ops and len(m.graphs) == 1:
            module_values[m.call] = m.graphs[0]
        else:
            module_values[m.call] = MIXED
        # 1 eager op in 2000 is not 100%, and 1 compiled op is not 0%
        share[m.call] = min(max(round(100 * m.compiled / m.ops, 1), 0.1 if m.compiled else 0.0),
                            99.9 if m.eager else 100.0)
    categories = {g.id: {"label": f"graph {g.id} ({g.func})", "color": _PALETTE[i % len(_PALETTE)]}
                  for i, g in enumerate(cmap.graphs)}
    categories[MIXED] = {"label": "several graphs, or graphs and eager", "color": "#bab0ac"}
    categories[EAGER] = {"label": "ran eagerly (outside every graph)", "color": "#e45756"}
    categories[BREAK] = {"label": "graph break", "color": "#b30000"}
    set_overlay(graph, "compiled", label="compiled by", kind="category", nodes=node_values, modules=module_values,
                categories=categories, description=f"torch.compile ({cmap.backend}): {cmap.header()}")
    ops_share = {n: (0 if g == EAGER else 100) for n, g in cmap.assigned.items()}
    set_overlay(graph, "coverage", label="compiled", kind="number", unit="%", nodes=ops_share, modules=share,
                reduce="mean", description="share of each module call's ops that ran inside a compiled graph "
                "(an op: 100 inside a graph, 0 eager)")
    panels = graph.annotations.get("panels") or {}
    for stale in ("breaks", "modules", "recompiles"):
        panels.pop(stale, None)
    if cmap.breaks:
        set_panel(graph, "breaks", title="graph breaks", columns=["line", "category", "reason", "count", "hint"],
                  rows=[_break_row(b) for b in cmap.breaks],
                  note=_plural(cmap.break_count, "break") + ", " + _plural(len(cmap.breaks), "cause"))
    ranked = cmap.ranking()
    if ranked:
        set_panel(graph, "modules", title="modules by ops outside graphs",
                  columns=["module", "class", "eager ops", "ops", "compiled"],
                  rows=[row(m.path, m.cls, m.eager, m.ops, percent(m.share), module=m.call,
                            level="error" if m.compiled == 0 else "warn") for m in ranked[:limit]],
                  note=f"{_plural(len(ranked), 'module call')} with ops outside graphs"
                  + (f"; the first {limit} shown" if len(ranked) > limit else ""))
    if cmap.recompiles or cmap.limits:
        rows = [(r.input_set, row(r.input_set, f"{r.func} ({r.file.rsplit('/', 1)[-1]}:{r.line})",
                                  one_line(r.reason, limit=200), level="warn")) for r in cmap.recompiles]
        for lim in cmap.limits:  # each input set the function ran eagerly in, after its recompiles
            rows += [(k, row(k, lim.where(), f"ran eagerly: {lim.config} ({lim.limit}) reached"
                             + (f" (last guard failed: {one_line(lim.reasons[-1], limit=150)})"
                                if k == lim.input_set and lim.reasons else ""), level="error"))
                     for k in lim.eager_sets]
        note = f"{_plural(cmap.input_sets, 'input set')}, {_plural(len(cmap.recompiles), 'recompile')}"
        if cmap.limits:
            note += "; " + "; ".join(lim.note() for lim in cmap.limits)
        set_panel(graph, "recompiles", title="recompiles", columns=["input set", "function", "guard failed"],
                  rows=[r for _, r in sorted(rows, key=lambda kr: kr[0])], note=note)
    return graph


def _break_row(b: BreakGroup) -> dict[str, Any]:
    return row(b.line_text(), CATEGORIES.get(b.category, b.category), one_line(b.reason, limit=200), b.count,
               b.hint or None, node=b.node, module=b.module or None, level="error")


def _plural(k: int, word: str) -> str:
    return f"{k} {word}{'' if k == 1 else 's'}"


def break_lines(breaks: Sequence[BreakGroup]) -> list[str]:
    """Each break's source line and where to read more (the ``breaks`` panel has the rest)."""
    out = []
    for b in breaks:
        w = b.where
        code = f"  {one_line(w.code, limit=120)}" if w is not None and w.code else ""
        out.append(f"✗ {b.line_text()}{code}")
        if b.link:
            out.append(f"    see {b.link}")
    return out


__all__ = ["BREAK", "EAGER", "MIXED", "break_lines", "module_coverage", "write"]
