"""The terminal report of a :class:`~fxviz.graphdiff.result.Diff` (the HTML page is
:mod:`fxviz.render.diffpage`).

The terminal report is a summary table (both captures: method, ops, time; the differences by
kind), then the module tree of the differences: a module call where nothing significant differs is
one line, a run of matched calls of one class is one line (``h.0-11 ×12 (GPT2Block)``), and a
call that differs opens to show its differences, each with its source line.

Everything here is drawing: statuses, counts, runs and the words for kinds and statuses come from
the Diff, and whatever came from the model (names, messages, source lines) reaches the terminal
through :func:`fxviz.text.one_line`. No torch here.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from fxviz.calls import Stack
from fxviz.graphdiff.parts import Difference, ModuleDiff, Run
from fxviz.graphdiff.result import HEADLINE_SEP, Diff
from fxviz.text import one_line

_STATUS_STYLE = {"matched": "green", "differs": "bold red", "only_in_a": "yellow", "only_in_b": "yellow"}
_ERR = "bold red"
_DIM = "dim"


def _seconds(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x * 1e3:.3g} ms" if x < 1 else f"{x:.3g} s"


def _name(d: Diff) -> str:
    return d.a.name or d.b.name


# ---- terminal ----------------------------------------------------------------------------------


def summary_table(d: Diff) -> Table:
    """Both captures (method, ops, time, outcome) and the alignment."""
    t = Table(title=one_line(f"{_name(d)}: {d.labels[0]} vs {d.labels[1]}"), title_justify="left")
    t.add_column("side")
    t.add_column("method")
    t.add_column("ops", justify="right")
    t.add_column("time", justify="right")
    t.add_column("outcome")
    for key, g, label in (("a", d.a, d.labels[0]), ("b", d.b, d.labels[1])):
        failure = d.failure(key)
        outcome = (f"failed: {one_line(failure.error_type)}" if failure is not None
                   else "partial: the model raised" if g.partial else "ok")
        t.add_row(one_line(label), one_line(g.method) or "–", str(len(g.ops)), _seconds(d.seconds.get(key)),
                  Text(outcome, style="green" if outcome == "ok" else _ERR))
    t.add_row("alignment", "", "", _seconds(d.seconds.get("align")), "")
    return t


def kinds_table(d: Diff) -> Table:
    """Differences per kind, and module calls per status."""
    t = Table(show_header=True)
    t.add_column("differences")
    t.add_column("count", justify="right")
    informational = d.summary(informational=True)
    for kind, n in d.summary().items():
        notes = informational.get(kind, 0)
        count = str(n) if not notes else f"{n} (informational)" if notes == n else f"{n} ({notes} informational)"
        style = _DIM if notes == n else ""
        t.add_row(Text(one_line(d.describe(kind)), style=style), Text(count, style=style))
    if not d:
        t.add_row(Text("none: the graphs agree", style="green"), "0")
    line = ", ".join(f"{n} {d.describe(s)}" for s, n in sorted(d.status_counts().items()))
    t.add_row(Text("module calls", style="bold"), one_line(line))
    return t


def _diff_line(x: Difference) -> Text:
    t = Text("· " if x.informational else "✗ ", style=_DIM if x.informational else _ERR)
    t.append(one_line(x.message), style=_DIM if x.informational else "")
    src = x.source
    if src is not None:
        t.append(f"  {one_line(src.short())}", style="cyan")
        if src.code:
            t.append(f" `{one_line(src.code)}`", style=_DIM)
    return t


@dataclass
class _Ctx:
    diff: Diff
    notes: bool
    byid: dict[str, Difference]
    children: dict[Stack, list[ModuleDiff]]
    runs: dict[Stack, Run]  # empty when every call is listed (with notes)


def _relative(path: str, parent: Stack) -> str:
    """``h.0.attn`` under ``h.0`` is ``attn``."""
    base = parent[-1][0] if parent else ""
    return path[len(base) + 1 :] if base and path.startswith(base + ".") else path


def _module_label(m: ModuleDiff, ctx: _Ctx, parent: Stack, run: Run | None = None) -> Text:
    status = m.status
    icon = {"matched": "✓", "differs": "✗"}.get(status, "○")
    t = Text(f"{icon} ", style=_STATUS_STYLE.get(status, ""))
    t.append(one_line(_relative(run.label if run else m.path, parent)), style="bold")
    if run:
        t.append(f" ×{len(run.calls)}", style="bold magenta")
    if m.cls:
        t.append(f" ({one_line(m.cls)})", style=_DIM)
    if m.call:
        t.append(f" call {m.call + 1}", style="magenta")
    # with one graph not captured, "only in" the other is what the failure already says
    if not ctx.diff.one_sided or status in ("matched", "differs"):
        t.append(f"  {one_line(ctx.diff.describe(status))}", style=_STATUS_STYLE.get(status, ""))
    total = run.notes if run else m.notes
    if total and not ctx.notes:
        t.append(f"  ({total} note{'s' if total != 1 else ''})", style=_DIM)
    return t


def _add_module(parent_tree: Tree, stack: Stack, ctx: _Ctx) -> None:
    kids = ctx.children.get(stack, [])
    i = 0
    while i < len(kids):
        m = kids[i]
        run = ctx.runs.get(m.stack)
        if run is not None:
            parent_tree.add(_module_label(m, ctx, stack, run))
            i += len(run.calls)
            continue
        i += 1
        if not m.significant and not (ctx.notes and m.notes):
            parent_tree.add(_module_label(m, ctx, stack))
            continue
        branch = parent_tree.add(_module_label(m, ctx, stack))
        _add_own(branch, m, ctx)
        _add_module(branch, m.stack, ctx)


def _add_own(tree: Tree, m: ModuleDiff, ctx: _Ctx) -> None:
    for did in m.differences:
        x = ctx.byid[did]
        if x.informational and not ctx.notes:
            continue
        node = tree.add(_diff_line(x))
        if x.kind == "capture_failed" and x.detail:
            for line in x.detail.strip().splitlines()[1:4]:
                if line.strip():
                    node.add(Text(one_line(line), style=_DIM))


def to_report(d: Diff, *, notes: bool = False) -> Group:
    """The terminal report of ``d``; ``notes=True`` also lists informational differences (and
    lists every call of a run of matched calls, so that each shows its notes)."""
    ctx = _Ctx(d, notes, d.by_id(), d.children(), {} if notes else d.runs())
    # the diff's answer (the page's headline too), its counts styled apart
    answer, sep, rest = d.headline().partition(HEADLINE_SEP)
    head = Text(one_line(_name(d) or "model"), style="bold")
    head.append(f"  {answer}", style=_ERR if d.significant else "green")
    if sep:
        head.append(sep + rest + ("" if notes else " (--notes lists them)"), style=_DIM)
    tree = Tree(head, guide_style="dim")
    root = d.root
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
    # force_jupyter=False: in a notebook rich would display the report itself, then `print` again
    console = Console(width=width, color_system=None, record=True, file=io.StringIO(), force_jupyter=False)
    console.print(to_report(d, notes=notes))
    return console.export_text().rstrip("\n")


__all__ = ["DiffView", "report_text", "summary_table", "to_report"]
