"""Renderers of a :class:`~fxviz.graphdiff.Diff`: a rich terminal report and a self-contained HTML page.

The terminal report is a summary table (both captures: method, ops, time; the differences by
kind), then the module tree of the differences: a module call where nothing significant differs is
one line, consecutive matched calls of one class fold into one (``h.0-11 ×12 (GPT2Block)``), and a
call that differs opens to show its differences, each with its source line.

The HTML page shows both graphs side by side, one section per module call, ops aligned row by row
and coloured by status, with a list of the differences that jumps to each one's row. Labels and
colours come from :mod:`fxviz.render.view`, as in every other renderer. No torch here.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from fxviz.calls import Stack
from fxviz.graphdiff import KINDS, Diff, Difference, ModuleDiff
from fxviz.ir import Graph, Node
from fxviz.render.files import write_text
from fxviz.render.view import KIND_COLORS, edge_label, node_color, node_label

_KIND_TITLES = {
    "capture_failed": "capture failed",
    "assumption": "assumed about the inputs",
    "only_in_a": "only in {a}",
    "only_in_b": "only in {b}",
    "calls": "module call counts",
    "shape": "shape",
    "dtype": "dtype",
    "decomposed": "decomposed (informational)",
    "symbolic_shape": "symbolic shape (informational)",
}
_STATUS_STYLE = {"matched": "green", "differs": "bold red", "only_in_a": "yellow", "only_in_b": "yellow"}
_ERR = "bold red"
_DIM = "dim"


def kind_title(kind: str, labels: tuple[str, str]) -> str:
    return _KIND_TITLES.get(kind, kind).format(a=labels[0], b=labels[1])


def status_text(status: str, labels: tuple[str, str]) -> str:
    return {"only_in_a": f"only in {labels[0]}", "only_in_b": f"only in {labels[1]}"}.get(status, status)


def _seconds(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x * 1e3:.3g} ms" if x < 1 else f"{x:.3g} s"


# ---- terminal ----------------------------------------------------------------------------------


def summary_table(d: Diff) -> Table:
    """Both captures (method, ops, time, outcome) and the alignment."""
    t = Table(title=f"{d.a.name or d.b.name}: {d.labels[0]} vs {d.labels[1]}", title_justify="left")
    t.add_column("side")
    t.add_column("method")
    t.add_column("ops", justify="right")
    t.add_column("time", justify="right")
    t.add_column("outcome")
    for key, g, label in (("a", d.a, d.labels[0]), ("b", d.b, d.labels[1])):
        failed = [x for x in g.attempts if not x.ok]
        outcome = "partial: the model raised" if g.partial else "ok"
        if failed and not g.ops:
            outcome = f"failed: {failed[-1].error_type}"
        t.add_row(label, g.method or "–", str(len(g.ops)), _seconds(d.seconds.get(key)),
                  Text(outcome, style="green" if outcome == "ok" else _ERR))
    t.add_row("alignment", "", "", _seconds(d.seconds.get("align")), "")
    return t


def kinds_table(d: Diff) -> Table:
    """Differences per kind, and module calls per status."""
    t = Table(show_header=True)
    t.add_column("differences")
    t.add_column("count", justify="right")
    summary = d.summary()
    for kind in KINDS:
        n = summary.get(kind, 0)
        if not n:
            continue
        notes = sum(1 for x in d.differences if x.kind == kind and x.informational)
        count = str(n) if not notes else f"{n} (informational)" if notes == n else f"{n} ({notes} informational)"
        style = _DIM if notes == n else ""
        t.add_row(Text(kind_title(kind, d.labels), style=style), Text(count, style=style))
    if not summary:
        t.add_row(Text("none: the graphs agree", style="green"), "0")
    statuses = d.status_counts()
    line = ", ".join(f"{n} {status_text(s, d.labels)}" for s, n in sorted(statuses.items()))
    t.add_row(Text("module calls", style="bold"), line)
    return t


def _diff_line(x: Difference) -> Text:
    t = Text("· " if x.informational else "✗ ", style=_DIM if x.informational else _ERR)
    t.append(x.message, style=_DIM if x.informational else "")
    src = x.source
    if src is not None:
        t.append(f"  {src.short()}", style="cyan")
        if src.code:
            t.append(f" `{src.code}`", style=_DIM)
    return t


@dataclass
class _Ctx:
    diff: Diff
    notes: bool
    byid: dict[str, Difference]
    children: dict[Stack, list[ModuleDiff]]
    significant: set[Stack]  # calls with a significant difference at or under them
    failed_side: bool


def _module_label(
    m: ModuleDiff, ctx: _Ctx, parent: Stack, fold: int = 0, last: str = "", notes: int | None = None
) -> Text:
    path = m.path
    base = parent[-1][0] if parent else ""
    name = path[len(base) + 1 :] if base and path.startswith(base + ".") else path
    if fold:
        head, _, first = name.rpartition(".")
        end = last.rpartition(".")[2]
        name = f"{head}.{first}-{end}" if head else f"{first}-{end}"
    status = m.status
    icon = {"matched": "✓", "differs": "✗"}.get(status, "○")
    t = Text(f"{icon} ", style=_STATUS_STYLE.get(status, ""))
    t.append(name, style="bold")
    if fold:
        t.append(f" ×{fold}", style="bold magenta")
    if m.cls:
        t.append(f" ({m.cls})", style=_DIM)
    if m.call:
        t.append(f" call {m.call + 1}", style="magenta")
    if not ctx.failed_side or status in ("matched", "differs"):
        t.append(f"  {status_text(status, ctx.diff.labels)}", style=_STATUS_STYLE.get(status, ""))
    total = m.notes if notes is None else notes
    if total and not ctx.notes:
        t.append(f"  ({total} note{'s' if total != 1 else ''})", style=_DIM)
    return t


def _foldable(a: ModuleDiff, b: ModuleDiff, ctx: _Ctx) -> bool:
    return (
        a.status == b.status == "matched" and a.cls == b.cls and a.call == b.call == 0
        and a.stack[:-1] == b.stack[:-1] and not ctx.notes
        and a.path.rpartition(".")[2].isdigit() and b.path.rpartition(".")[2].isdigit()
    )


def _add_module(parent_tree: Tree, stack: Stack, ctx: _Ctx) -> None:
    kids = ctx.children.get(stack, [])
    i = 0
    while i < len(kids):
        m = kids[i]
        collapsed = m.stack not in ctx.significant and not (ctx.notes and m.notes)
        if collapsed:
            j = i
            while j + 1 < len(kids) and _foldable(kids[i], kids[j + 1], ctx) and kids[j + 1].stack not in ctx.significant:
                j += 1
            if j > i:
                folded = kids[i : j + 1]
                parent_tree.add(_module_label(m, ctx, stack, fold=len(folded), last=kids[j].path,
                                              notes=sum(k.notes for k in folded)))
            else:
                parent_tree.add(_module_label(m, ctx, stack))
            i = j + 1
            continue
        branch = parent_tree.add(_module_label(m, ctx, stack))
        _add_own(branch, m, ctx)
        _add_module(branch, m.stack, ctx)
        i += 1


def _add_own(tree: Tree, m: ModuleDiff, ctx: _Ctx) -> None:
    for did in m.differences:
        x = ctx.byid[did]
        if x.informational and not ctx.notes:
            continue
        node = tree.add(_diff_line(x))
        if x.kind == "capture_failed" and x.detail:
            for line in x.detail.strip().splitlines()[1:4]:
                if line.strip():
                    node.add(Text(line.strip(), style=_DIM))


def to_report(d: Diff, *, notes: bool = False) -> Group:
    """The terminal report of ``d``; ``notes=True`` also lists informational differences."""
    children: dict[Stack, list[ModuleDiff]] = {}
    root: ModuleDiff | None = None
    for m in d.modules:
        if not m.stack:
            root = m
            continue
        children.setdefault(m.stack[:-1], []).append(m)
    significant: set[Stack] = set()
    for x in d.differences:
        if not x.informational:
            significant.update(x.stack[:k] for k in range(len(x.stack) + 1))
    failed_side = any(x.kind == "capture_failed" for x in d.differences)
    ctx = _Ctx(d, notes, d.by_id(), children, significant, failed_side)

    name = d.a.name or d.b.name or "model"
    head = Text(name, style="bold")
    if d.significant:
        head.append(f"  ✗ {len(d.significant)} difference{'s' if len(d.significant) != 1 else ''}", style=_ERR)
    else:
        head.append("  ✓ no significant differences", style="green")
    informational = len(d.differences) - len(d.significant)
    if informational:
        head.append(f"  ·  {informational} informational" + ("" if notes else " (--notes lists them)"), style=_DIM)
    tree = Tree(head, guide_style="dim")
    if root is not None:
        _add_own(tree, root, ctx)
    _add_module(tree, (), ctx)
    return Group(summary_table(d), kinds_table(d), tree)


class DiffView:
    """A renderable for ``rich.print`` / ``Console.print`` with report options bound."""

    def __init__(self, d: Diff, *, notes: bool = False) -> None:
        self.diff, self.notes = d, notes

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield to_report(self.diff, notes=self.notes)


def report_text(d: Diff, *, width: int = 120, notes: bool = False) -> str:
    """The report as plain text (no colour), as ``str(diff)`` gives it."""
    console = Console(width=width, color_system=None, record=True, file=io.StringIO())
    console.print(to_report(d, notes=notes))
    return console.export_text().rstrip("\n")


# ---- HTML --------------------------------------------------------------------------------------

_TEMPLATES = Path(__file__).parent / "templates"
_ROW_COLORS = {
    "same": "", "only_in_a": "#fff3cd", "only_in_b": "#fff3cd", "shape": "#f8d7da", "dtype": "#f8d7da",
    "decomposed": "#e2e3f3", "symbolic_shape": "#e2e3f3", "calls": "#f8d7da", "capture_failed": "#f8d7da",
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
            "name": n.name, "label": node_label(n), "color": node_color(n), "target": n.target,
            "meta": ", ".join(edge_label(m) for m in n.outputs),
            "source": f"{n.source.short()} {n.source.code}" if n.source else "",
        })
    return out


def _sections(d: Diff) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """One section per module call with its aligned rows, and difference id -> anchor of its row
    (or of its module call's section, for a difference without a row)."""
    row_of: dict[str, str] = {}
    sections: list[dict[str, Any]] = []
    for m in d.modules:
        sid = "m-" + ("/".join(f"{p}#{c}" for p, c in m.stack) or "root")
        rows = []
        for k, r in enumerate(m.rows):
            rid = f"{sid}-r{k}"
            if r.diff:
                row_of.setdefault(r.diff, rid)
            rows.append({
                "id": rid, "status": r.status, "color": _ROW_COLORS.get(r.status, ""),
                "a": _cell(d.a, r.a), "b": _cell(d.b, r.b), "diff": r.diff,
            })
        for did in m.differences:
            row_of.setdefault(did, sid)
        sections.append({
            "id": sid, "path": m.path or (d.a.name or d.b.name), "call": m.call, "cls": m.cls,
            "depth": len(m.stack), "status": m.status, "status_text": status_text(m.status, d.labels),
            "ops_a": m.ops_a, "ops_b": m.ops_b, "rows": rows, "notes": m.notes,
            "open": m.status != "matched",
        })
    return sections, row_of


def html_context(d: Diff) -> dict[str, Any]:
    """Everything the template shows, as plain data."""
    sections, anchors = _sections(d)
    diffs = []
    for x in d.differences:
        src = x.source
        diffs.append({
            "id": x.id, "kind": kind_title(x.kind, d.labels), "message": x.message, "detail": x.detail,
            "informational": x.informational, "module": x.module or "(root)", "call": x.call,
            "source": f"{src.short()}  {src.code}" if src else "", "anchor": anchors.get(x.id, ""),
        })
    return {
        "title": f"{d.a.name or d.b.name}: {d.labels[0]} vs {d.labels[1]}",
        "labels": d.labels,
        "sides": [
            {"label": d.labels[0], "method": d.a.method or "–", "ops": len(d.a.ops),
             "time": _seconds(d.seconds.get("a")),
             "failed": [a.reason() for a in d.a.attempts if not a.ok]},
            {"label": d.labels[1], "method": d.b.method or "–", "ops": len(d.b.ops),
             "time": _seconds(d.seconds.get("b")),
             "failed": [a.reason() for a in d.b.attempts if not a.ok]},
        ],
        "align_time": _seconds(d.seconds.get("align")),
        "summary": [(kind_title(k, d.labels), n) for k, n in d.summary().items()],
        "significant": len(d.significant),
        "differences": diffs,
        "sections": sections,
        "colors": KIND_COLORS,
    }


def to_html(d: Diff, path: str | os.PathLike[str] | None = None) -> str:
    """The side-by-side page as one self-contained HTML string; written to ``path`` when given."""
    text: str = _template().render(**html_context(d))
    if path is not None:
        write_text(path, text, what="diff report")
    return text


__all__ = ["DiffView", "html_context", "report_text", "summary_table", "to_html", "to_report"]
