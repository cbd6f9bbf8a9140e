"""A pipeline drawn with what every renderer already shows: an overlay and a panel. No torch.

:func:`annotate` writes on one stage's graph the ``pass_change`` overlay (each node: ``added``,
``replaced`` or ``kept`` against the stage before; boxes take the strongest change inside) and the
``pipeline`` panel (the stage table: pass, time, ops before -> after, +added -removed, max error;
each row points at the first node the pass changed), and gives each changed node a ``provenance``
attribute (its origin stage by stage, which the report's details show). The tree, the HTML report and JSON then draw
them with no renderer change.
"""

from __future__ import annotations

import math
from typing import Any

from fxviz.analyze.pipeline.result import Pipeline, Stage
from fxviz.ir import Graph
from fxviz.passes.overlays import set_overlay
from fxviz.passes.panels import row, set_headline, set_panel
from fxviz.text import NOTE_CHARS, one_line

OVERLAY = "pass_change"
PANEL = "pipeline"
#: The last column is one measure, named: the largest |stage - eager| over the stage's outputs,
#: ✗ when an element is beyond its dtype's tolerance (:func:`tolerance_note`).
ERROR_COLUMN = "outputs' max abs error"
COLUMNS = ["#", "pass", "time", "ops", "+added", "-removed", ERROR_COLUMN]
CATEGORIES = {
    "added": {"label": "added", "color": "#2ca02c"},
    "replaced": {"label": "replaced", "color": "#ff7f0e"},
    "moved": {"label": "moved", "color": "#9467bd"},
    "kept": {"label": "kept", "color": "#c7c7c7"},
}
_RANK = {"kept": 0, "moved": 1, "added": 2, "replaced": 3}


def fmt_seconds(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"


def max_error(stage: Stage) -> str:
    n = stage.numbers
    if n is None:
        return "-"
    if not n.checked:
        return "skipped"
    return f"{n.max_abs:.3g}" + ("" if n.ok else " ✗")


def tolerance_note(p: Pipeline) -> str:
    """What the error column measures and the tolerance its ✗ compares with, by output dtype:
    ``outputs' max abs error: the largest |stage − eager| over the outputs; ✗: an element beyond
    atol + rtol·|eager| (float32: atol 0.0001, rtol 0.0001)``."""
    tols = sorted({(o.dtype, o.atol, o.rtol) for s in p.stages if s.numbers is not None for o in s.numbers.outputs
                   if o.atol is not None and o.rtol is not None and (o.atol or o.rtol)})
    if not any(s.numbers is not None and s.numbers.checked for s in p.stages):
        return ""
    by = ", ".join(f"{d}: atol {a:g}, rtol {r:g}" for d, a, r in tols)
    return (f"{ERROR_COLUMN}: the largest |stage − eager| over the stage's outputs; ✗: an element beyond "
            f"atol + rtol·|eager|" + (f" ({by})" if by else ""))


def stage_cells(stage: Stage) -> list[Any]:
    """The stage table's cells for one stage (shared by the terminal table and the panel)."""
    before, after = sum(stage.ops_before.values()), sum(stage.ops_after.values())
    name = stage.name + (" (failed)" if stage.failed else "" if stage.changed else " (no change)") + (
        f" · {len(stage.moved)} moved" if stage.moved else "")
    ops = str(after) if stage.index == 0 else f"{before} → {after}"
    return [stage.index, name, fmt_seconds(stage.seconds), ops,
            f"+{len(stage.added) + len(stage.replaced)}", f"-{len(stage.removed)}", max_error(stage)]


def stage_keys(stage: Stage) -> list[float | None]:
    """What the report sorts each of the stage's cells by: seconds, ops after, nodes added and
    removed, the outputs' max abs error (a stage without numbers: none)."""
    n = stage.numbers
    err = n.max_abs if n is not None and n.checked else None
    return [stage.index, None, stage.seconds, sum(stage.ops_after.values()), len(stage.added) + len(stage.replaced),
            len(stage.removed), err if err is not None and math.isfinite(err) else None]


def stage_level(p: Pipeline, stage: Stage) -> str:
    if stage.failed:
        return "error"
    div = p.first_divergence
    if div is not None and div.stage == stage.index:
        return "error"
    if stage.numbers is not None and stage.numbers.checked and not stage.numbers.ok:
        return "warn"
    return "ok" if stage.changed else "info"


def categories(stage: Stage) -> dict[str, str]:
    """Each op node of the stage: ``added``, ``replaced``, ``moved`` or ``kept`` (a kernel that
    moved stands for post-grad nodes too: moved is what its stage says of it)."""
    replaced, added, moved = set(stage.replaced), set(stage.added), set(stage.moved)
    out: dict[str, str] = {}
    for n in stage.graph.nodes:
        if n.kind == "op":
            out[n.name] = ("moved" if n.name in moved else "replaced" if n.name in replaced else
                           "added" if n.name in added else "kept")
    return out


def provenance_text(p: Pipeline, index: int, node: str) -> str:
    """``stage 2 linear_relu <- stage 1 linear_relu_default <- stage 0 linear, relu_3 (inferred)``."""
    parts = []
    for at, items in zip(p.chain(index), p.trace(index, node), strict=False):
        names = ", ".join(n + ("" if kind == "exact" else " (inferred)") for n, kind in items) or "(none)"
        parts.append(f"stage {at} {names}")
    return " <- ".join(parts)


def annotate(p: Pipeline, index: int, *, show_unchanged: bool = False,
             stages: range | None = None, pages: dict[int, str] | None = None) -> Graph:
    """Stage ``index``'s graph with the change overlay and the stage-table panel written on it;
    ``pages`` (stage index -> a sibling .html file) links each other stage's row to its report."""
    stage = p.stage(index)
    graph = stage.graph
    nodes = categories(stage)  # stage 0: every op kept (the start)
    tree = graph.calls
    modules: dict[str, str] = {}
    for name, cat in nodes.items():
        cid = tree.of(name).id
        if cid and _RANK[cat] > _RANK.get(modules.get(cid, "kept"), 0):
            modules[cid] = cat
        elif cid:
            modules.setdefault(cid, cat)
    for name in nodes:
        if name in stage.links:  # the details of a changed node say where it comes from, stage by stage
            graph.node(name).attrs["provenance"] = provenance_text(p, index, name)
    set_overlay(graph, OVERLAY, label=f"change in stage {index} ({stage.name})", kind="category", nodes=nodes,
                modules=modules, categories=CATEGORIES,
                description="what this stage's pass did to each node: added, replaced (stands for nodes it "
                            "removed), moved (kept, elsewhere in the order) or kept")
    rows = []
    for s in p.visible(show_unchanged=show_unchanged):
        if stages is not None and s.index not in stages:
            continue
        first = next(iter([*s.replaced, *s.added, *s.moved]), None) if s.index == index else None
        href = (pages or {}).get(s.index) if s.index != index else None
        rows.append(row(*stage_cells(s), node=first, level=stage_level(p, s), href=href, sort=stage_keys(s)))
    hidden = len(p.stages) - len(p.visible(show_unchanged=show_unchanged))
    note = [f"showing stage {index} ({stage.name})", *stage.notes]
    if hidden:
        note.append(f"{hidden} stage{'s' if hidden > 1 else ''} without changes hidden")
    if p.first_divergence is not None:
        note.append(f"numbers first diverge at {p.first_divergence}")
    failed = p.failed
    if failed is not None and failed.error is not None:
        note.append(f"stage {failed.index} ({failed.name}) failed: {failed.error}")
    if tolerance_note(p):
        note.append(tolerance_note(p))
    set_panel(graph, PANEL, title="pass pipeline", columns=COLUMNS, rows=rows, note="; ".join(note))
    div = p.first_divergence
    set_headline(graph, p.headline(), panel=PANEL,
                 level="error" if failed is not None or div is not None else "ok",
                 node=div.node if div is not None and div.stage == index and div.node else None,
                 notes=[line.removeprefix("note: ") for line in summary_lines(p, show_unchanged)], overlay=OVERLAY)
    return graph


def summary_lines(p: Pipeline, show_unchanged: bool) -> list[str]:
    """What the terminal prints under the stage table, which the report shows under the headline:
    the hidden stages, the pass that failed and its line, where the numbers first diverge and
    why there, the tolerance, the pipeline's notes."""
    lines = []
    hidden = len(p.stages) - len(p.visible(show_unchanged=show_unchanged))
    if hidden:
        lines.append(f"{hidden} stage{'s' if hidden > 1 else ''} without changes hidden (--all shows them)")
    failed = p.failed
    if failed is not None and failed.error is not None:
        lines.append(f"stage {failed.index} ({one_line(failed.name)}) failed: {one_line(str(failed.error))}")
        if failed.error.frame is not None and failed.error.frame.code:
            lines.append(f"    {one_line(failed.error.frame.code)}")
    if p.first_divergence is not None and p.first_divergence.note:
        lines.append(f"first divergence: {one_line(p.first_divergence.note)}")
    if tolerance_note(p):
        lines.append(tolerance_note(p))
    lines.extend(f"note: {one_line(n, limit=NOTE_CHARS)}" for n in p.notes)
    return lines


__all__ = ["CATEGORIES", "COLUMNS", "ERROR_COLUMN", "OVERLAY", "PANEL", "annotate", "categories", "fmt_seconds", "provenance_text",
           "stage_cells", "stage_keys", "summary_lines", "tolerance_note"]
