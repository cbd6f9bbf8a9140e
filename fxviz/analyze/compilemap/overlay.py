"""The compile map written onto the eager graph: overlays and panels every renderer shows. No torch.

* overlay ``compiled`` (category): per op the compiled graph that ran it (``g0``, ``g1``, …),
  ``eager``, or ``break`` for the op where the graph broke (``.item()``, ``bool(tensor)``); per
  module call its one graph, ``mixed`` when several graphs or graphs and eager ops ran it, ``eager``;
* overlay ``coverage`` (number, %): per module call the share of its ops (any depth) that ran
  inside a compiled graph;
* panels ``breaks`` (grouped by cause and line, with the hint), ``modules`` (module calls ranked by
  ops left outside graphs), ``recompiles`` (one row per recompile: which input set, torch's compile
  id, the guard that failed; the input sets a function ran eagerly in after Dynamo hit its
  recompile limit, marked as errors),
  ``shapes`` (symbolic sizes and the guards on them, with their user lines) and ``guards`` (every
  guard).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from fxviz.analyze.compilemap.kinds import BREAK, CATEGORIES, EAGER, MIXED, UNRUN
from fxviz.analyze.compilemap.opcount import OPS_COUNTED
from fxviz.analyze.compilemap.result import (
    BreakGroup,
    CompileMap,
    ModuleCoverage,
    percent,
    torch_guard_count,
    torch_op_count,
)
from fxviz.ir import Graph, module_class
from fxviz.passes.overlays import set_overlay
from fxviz.passes.panels import row, set_headline, set_panel
from fxviz.text import one_line

#: Graph colours, cycled; red stays for eager and breaks.
_PALETTE = ("#4c78a8", "#54a24b", "#72b7b2", "#b279a2", "#f58518", "#9d755d", "#eeca3b", "#1f77b4", "#2ca02c",
            "#17becf")
#: What fxviz's guard counts count, beside torch's own (the compilation metrics' ``guard_count``).
GUARDS_COUNTED = ("fxviz counts each distinct guard once, a ShapeEnv check by check; torch's guard_count "
                  "counts the Guard objects Dynamo installed, a check installed twice twice")
#: Rows of the ``guards`` panel the tree prints (a model has a guard per parameter and more).
GUARD_PAGE = 20


def module_coverage(graph: Graph, assigned: Mapping[str, str]) -> list[ModuleCoverage]:
    """Every module call (the model first, then in execution order) with its ops, any depth, and
    how many of them ran inside a compiled graph."""
    out = []
    for call in graph.calls.walk():
        names = [n for n in call.nodes if n in assigned and assigned[n] != UNRUN]
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
    categories[UNRUN] = {"label": "not run under torch.compile (a path only eager takes)", "color": "#d9d9d9"}
    set_overlay(graph, "compiled", label="compiled by", kind="category", nodes=node_values, modules=module_values,
                categories=categories, description=f"torch.compile ({cmap.backend}): {cmap.header()}")
    ops_share = {n: (0 if g == EAGER else 100) for n, g in cmap.assigned.items() if g != UNRUN}
    set_overlay(graph, "coverage", label="compiled", kind="number", unit="%", nodes=ops_share, modules=share,
                reduce="mean", description="share of each module call's ops that ran inside a compiled graph "
                "(an op: 100 inside a graph, 0 eager)")
    panels = graph.annotations.get("panels") or {}
    for stale in ("breaks", "modules", "graphs", "recompiles", "shapes", "guards"):
        panels.pop(stale, None)
    if cmap.breaks:
        break_panel(graph, "breaks", "graph breaks", cmap.breaks,
                    _plural(cmap.break_count, "break") + ", " + _plural(len(cmap.breaks), "cause"))
    ranked = cmap.ranking()
    if ranked:
        set_panel(graph, "modules", title="modules by ops outside graphs",
                  columns=["module", "class", "eager ops", "ops", "compiled"],
                  rows=[row(m.path, m.cls, m.eager, m.ops, percent(m.share), module=m.call,
                            level="error" if m.compiled == 0 else "warn") for m in ranked[:limit]],
                  note=f"{_plural(len(ranked), 'module call')} with ops outside graphs"
                  + (f"; the first {limit} shown" if len(ranked) > limit else ""))
    _graphs_panel(cmap)
    if cmap.recompiles or cmap.limits:
        rows = [(r.input_set, row(r.input_set, f"{r.func} ({r.file.rsplit('/', 1)[-1]}:{r.line})", r.compile_id or None,
                                  one_line(r.reason, limit=200), r.advice or None, level="warn")) for r in cmap.recompiles]
        for lim in cmap.limits:  # each input set the function ran eagerly in, after its recompiles
            rows += [(k, row(k, lim.where(), (lim.compile_id or None) if k == lim.input_set else None,
                             f"ran eagerly: {lim.config} ({lim.limit}) reached"
                             + (f" (last guard failed: {one_line(lim.reasons[-1], limit=150)})"
                                if k == lim.input_set and lim.reasons else ""), None, level="error"))
                     for k in lim.eager_sets]
        note = f"{_plural(cmap.input_sets, 'input set')}, {_plural(len(cmap.recompiles), 'recompile')}"
        if cmap.limits:
            note += "; " + "; ".join(lim.note() for lim in cmap.limits)
        set_panel(graph, "recompiles", title="recompiles", columns=["input set", "function", "compile", "guard failed", "advice"],
                  rows=[r for _, r in sorted(rows, key=lambda kr: kr[0])], note=note)
    _guard_panels(cmap)
    first = cmap.breaks[0].node if cmap.breaks else None
    set_headline(graph, cmap.headline(), level="error" if cmap.limits else "warn" if cmap.break_count else "ok",
                 panel="recompiles" if cmap.limits else "breaks" if cmap.breaks else "modules" if ranked
                 else "graphs" if cmap.graphs else None,
                 node=first if first in {n.name for n in graph.nodes} else None, notes=report_notes(cmap),
                 overlay="compiled")
    return graph


def report_notes(cmap: CompileMap) -> list[str]:
    """The notes the terminal prints under the headline (``note: ...``: the map's, then what was
    recorded inside torch.compile), which the report shows under it: one list for both."""
    from fxviz.analyze.inside.overlay import notes

    return [*cmap.notes, *(notes(cmap.inside) if cmap.inside is not None else ())]


def _graphs_panel(cmap: CompileMap) -> None:
    """Panel ``graphs``: the facts behind the headline's count and share, one row per Dynamo graph
    (its function and line, the ops it holds of the eager graph's, how often it ran, its guards),
    pointing at its first op in the eager graph."""
    if not cmap.graphs:
        return
    first: dict[str, str] = {}
    for name, gid in cmap.assigned.items():
        first.setdefault(gid, name)
    held = {g.id: sum(1 for v in cmap.assigned.values() if v == g.id) for g in cmap.graphs}
    set_panel(cmap.graph, "graphs", title="compiled graphs",
              columns=["graph", "function", "line", "eager ops in it", "runs", "guards (distinct)",
                       "torch guard_count", "inputs", "torch graph_op_count", "in torch's count, no eager op"],
              rows=[row(g.id, g.func, _at(g.file, g.line), held[g.id], g.runs, len(g.guards), g.torch_guard_count,
                        ", ".join(g.inputs) or None, g.torch_op_count, _no_eager(g.no_eager_op),
                        node=first.get(g.id), level="ok") for g in cmap.graphs],
              note=f"{_plural(len(cmap.graphs), 'graph')}; {_plural(cmap.compiled_ops, 'op')} of {cmap.ops} "
                   f"ran inside one{_torch_ops(cmap)}; {OPS_COUNTED}; {GUARDS_COUNTED}")


def _no_eager(texts: Sequence[str]) -> str | None:
    counts: dict[str, int] = {}
    for t in texts:
        counts[t] = counts.get(t, 0) + 1
    return ", ".join(f"{t} x{k}" if k > 1 else t for t, k in counts.items()) or None


def _torch_ops(cmap: CompileMap) -> str:
    n = torch_op_count(cmap.graphs)
    return f" (torch's graph_op_count {n})" if n is not None else ""


def _at(file: str, line: int) -> str:
    return f"{file.rsplit('/', 1)[-1]}:{line}" if line else ""


def _guard_panels(cmap: CompileMap) -> None:
    """Panel ``shapes``: each graph's symbolic sizes (the input dimension, range, the user line
    that guarded it, whether to mark it dynamic) and its guards on them; panel ``guards``: every
    guard of every graph (the terminal shows a page of them, :func:`guard_lines`)."""
    graph = cmap.graph
    rows = []
    for g in cmap.graphs:
        for sym in g.symbols:
            rows.append(row(g.id, sym.text(), _at(sym.file, sym.line), sym.code or None, sym.advice or None,
                            level="warn" if sym.specialised is None and sym.line else "info"))
        for sg in g.shape_guards:
            code = (sg.code + (f" (in {sg.via})" if sg.via else "")) or one_line(sg.framework, limit=120)
            rows.append(row(g.id, sg.expr, _at(sg.file, sg.line), code or None, None, level="info"))
    if rows:
        set_panel(graph, "shapes", title="dynamic shapes", columns=["graph", "symbol / guard", "line", "code", "advice"],
                  rows=rows, note=f"{_plural(sum(len(g.symbols) for g in cmap.graphs), 'symbolic size')}, "
                  f"{_plural(sum(len(g.shape_guards) for g in cmap.graphs), 'shape guard')}")
    every = [row(g.id, text) for g in cmap.graphs for text in g.guards]
    if every:
        spec = set_panel(graph, "guards", title="guards", columns=["graph", "guard"], rows=every,
                         note=f"{_plural(len(every), 'distinct guard')} of {_plural(len(cmap.graphs), 'graph')}"
                         + _torch_count(cmap) + f" ({GUARDS_COUNTED})")
        spec["page"] = GUARD_PAGE  # the tree prints a page of them; the report and the JSON every one


def _torch_count(cmap: CompileMap) -> str:
    n = torch_guard_count(cmap.graphs)
    return f"; torch's guard_count {n}" if n is not None else ""


@contextlib.contextmanager
def without_panels(graph: Graph, *names: str) -> Iterator[None]:
    """The graph without some panels for a while (the terminal pages the long ones itself); they
    come back in their places (the report written after lists them in the order JSON keeps)."""
    panels = graph.annotations.get("panels") or {}
    before = dict(panels)
    for n in names:
        panels.pop(n, None)
    try:
        yield
    finally:
        panels.clear()
        panels.update(before)


def guard_lines(cmap: CompileMap, *, limit: int = 10) -> list[str]:
    """The terminal's page of guards: per graph with symbolic sizes or shape guards, its inputs'
    shapes, each symbol (input dimension, range, the user line that guarded it, advice) and shape
    guard, at most ``limit`` lines of them with ``... N more``; how many guards each graph has
    (the ``guards`` panel lists them); then each recompile's input dimension and advice."""
    out = []
    for g in cmap.graphs:
        if not g.symbols and not g.shape_guards:
            continue
        theirs = f", torch's guard_count {g.torch_guard_count}" if g.torch_guard_count is not None else ""
        out.append(f"{g.id} {g.func}  {', '.join(g.inputs)}  ({_plural(len(g.guards), 'distinct guard')}{theirs})")
        lines = []
        for sym in g.symbols:
            at = f"  ← {_at(sym.file, sym.line)}  {one_line(sym.code, limit=80)}" if sym.line else ""
            lines.append(f"  {sym.text()}{at}")
            if sym.advice:
                lines.append(f"      {one_line(sym.advice, limit=200)}")
        for sg in g.shape_guards:
            at = f"  ← {_at(sg.file, sg.line)}  {one_line(sg.code, limit=80)}" if sg.line else ""
            via = f"  (in {sg.via})" if sg.via else ""
            lines.append(f"  guard {sg.expr}{at}{via}")
        out.extend(lines[:limit])
        if len(lines) > limit:
            out.append(f"  ... {len(lines) - limit} more (--json and --html keep every one)")
    if any(g.guards for g in cmap.graphs):
        counts = ", ".join(f"{g.id} {len(g.guards)}" + (f" (torch {g.torch_guard_count})" if g.torch_guard_count
                                                          is not None else "") for g in cmap.graphs[:limit])
        more = f", ... {len(cmap.graphs) - limit} more graphs" if len(cmap.graphs) > limit else ""
        out.append(f"distinct guards: {counts}{more} (--json and --html list every one; {GUARDS_COUNTED})")
    for r in cmap.recompiles:
        if r.input or r.advice:
            cid = f", compile {r.compile_id}" if r.compile_id else ""
            out.append(f"recompile (input set {r.input_set}, {r.func}{cid}): {one_line(r.reason, limit=200)}")
            if r.advice:
                out.append(f"    {one_line(r.advice, limit=200)}")
    return out


def break_panel(graph: Graph, name: str, title: str, breaks: Sequence[BreakGroup], note: str) -> None:
    """A panel of ``breaks`` with what :func:`break_lines` prints of each: its place and that line's
    code, the remedy and the page to read, and the library line it broke inside with its code."""
    in_library = any(b.library is not None for b in breaks)
    set_panel(graph, name, title=title,
              columns=["line", "category", "reason", "count", "hint"] + (["broke in (library)"] if in_library else [])
              + ["code", "see"],
              rows=[_break_row(b, in_library) for b in breaks], note=note)


def _break_row(b: BreakGroup, in_library: bool = False) -> dict[str, Any]:
    lib, w = b.library, b.where
    inside = lib is not None and f"{lib.short()} in {lib.func}" + (f": {one_line(lib.code, limit=100)}" if lib.code else "")
    extra = [inside or None] if in_library else []
    return row(b.line_text(), CATEGORIES.get(b.category, b.category), one_line(b.reason, limit=200), b.count,
               b.hint or None, *extra, one_line(w.code, limit=120) if w is not None and w.code else None,
               b.link or None, node=b.node, module=b.module or None, level="error")


def _plural(k: int, word: str) -> str:
    return f"{k} {word}{'' if k == 1 else 's'}"


def break_lines(breaks: Sequence[BreakGroup]) -> list[str]:
    """Each break's place (the user's line), the library line it broke inside when there is one, and
    where to read more (the ``breaks`` panel has the rest)."""
    out = []
    for b in breaks:
        w = b.where
        code = f"  {one_line(w.code, limit=120)}" if w is not None and w.code else ""
        out.append(f"✗ {b.line_text()}{code}")
        lib = b.library
        if lib is not None:
            inside = f": {one_line(lib.code, limit=100)}" if lib.code else ""
            out.append(f"    broke inside {lib.short()} ({lib.func}){inside}")
        if b.link:
            out.append(f"    see {b.link}")
    return out


__all__ = ["BREAK", "EAGER", "MIXED", "UNRUN", "break_lines", "break_panel", "guard_lines", "module_coverage", "report_notes", "without_panels",
           "write"]
