"""The terminal's and the report's view of ``fxviz compile --inside`` / ``--from-trace``: per
compiled graph the stage table (``fxviz passes``' own), the kernel table (slowest first), the
compile cost table and, with a backward, the partition table; ``--stage N`` prints one stage's tree as ``fxviz passes --stage`` does."""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING

from fxviz.errors import TargetError
from fxviz.text import NOTE_CHARS, clean, one_line

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from fxviz.analyze.inside.result import Inside, InsideGraph
    from fxviz.ir import Graph

#: Kernel rows the terminal prints per graph (the JSON and the report keep all).
KERNEL_ROWS = 25


def kernel_table(g: InsideGraph) -> Table:
    from rich.table import Table

    from fxviz.analyze.inside.overlay import by_time

    table = Table(title=f"{g.id} ({g.compile_id}) kernels: {len(g.kernels)}, {g.share_mapped * 100:.0f}% of "
                        f"post-grad ops mapped", title_justify="left")
    for c in ("kernel", "kind", "part", "ops", "eager ops", "modules", "time", "share"):
        table.add_column(c, justify="right" if c in ("ops", "time", "share") else "left")
    ks = by_time(g.kernels)
    for k in ks[:KERNEL_ROWS]:
        mods = one_line(", ".join(m or "(model)" for m in k.modules), limit=50) + (" ✗ crosses modules" if k.crosses_modules else "")
        table.add_row(clean(k.name), k.kind_where, k.part + (" (inferred)" if k.inferred else ""), str(len(k.ops)),
                      clean(one_line(", ".join(k.eager), limit=50)), clean(mods),
                      f"{k.time_us:.1f} µs" if k.time_us is not None else "-",
                      f"{k.share * 100:.1f}%" if k.share is not None else "-")
    if len(ks) > KERNEL_ROWS:
        table.caption = f"{len(ks) - KERNEL_ROWS} more (--json and --html list every one)"
    return table


def cost_table(g: InsideGraph) -> Table | None:
    from rich.table import Table

    from fxviz.analyze.inside.costs import cost_rows

    if g.cost is None:
        return None
    table = Table(title=f"{g.id} ({g.compile_id}) compile cost", title_justify="left")
    table.add_column("what")
    table.add_column("seconds / outcome", justify="right")
    for what, value in cost_rows(g.cost):
        table.add_row(what, value)
    return table


def partition_table(g: InsideGraph, rows: int = 15) -> Table | None:
    """Per module what ``g``'s compiled backward saves (bytes, values) and recomputes (ops)."""
    from rich.table import Table

    from fxviz.analyze.inside.partition import size, summary

    p = g.partition
    if p is None:
        return None
    how = f" ({p.partitioner} partitioner)" if p.partitioner else ""
    title = f"{g.id} ({g.compile_id}) partition{how}: {summary([p])}"
    table = Table(title=title, title_justify="left", min_width=min(len(title), 100))
    for c in ("module", "saved", "values", "recomputed ops"):
        table.add_column(c, justify="right" if c in ("saved", "values") else "left")
    ops: dict[str, list[str]] = {}
    for r in p.recomputed:
        ops.setdefault("?" if r.module is None else r.module, []).append(r.op)
    per = p.per_module()
    for module, saved, values, _ in per[:rows]:
        names = ops.get(module, [])
        table.add_row(clean(module or "(model)"), size(saved), str(values),
                      clean(one_line(", ".join(f"{o}" + (f" x{names.count(o)}" if names.count(o) > 1 else "")
                                               for o in dict.fromkeys(names)), limit=60)) or "-")
    if len(per) > rows:
        table.caption = f"{len(per) - rows} more modules (--json and --html list every value)"
    return table


def print_inside(console: Console, inside: Inside, *, stage: int | None, graph: str | None) -> None:
    """Per compiled graph (or the one ``graph`` names): the stage, kernel and cost tables; with
    ``stage``, that stage's tree instead, its changes marked."""
    from fxviz.analyze.pipeline.views import annotate
    from fxviz.cli.passes import stage_table

    console.print(f"inside torch.compile: {inside.summary()}", markup=False)
    for note in inside.notes:
        console.print(f"note: {one_line(note, limit=NOTE_CHARS)}", markup=False)
    graphs = [pick(inside, graph)] if graph is not None or stage is not None else inside.graphs
    for g in graphs:
        p = g.pipeline
        if stage is not None:
            if not 0 <= stage < len(p.stages):
                raise TargetError(f"--stage {stage}: {g.id} has stages 0 to {len(p.stages) - 1}")
            console.print(annotate(p, stage, show_unchanged=True).tree(overlay="pass_change"))
            continue
        console.print(stage_table(p, show_unchanged=True, stages=range(len(p.stages))))
        for s in p.stages:  # what torch recorded of a stage's passes (buckets, collectives moved)
            for note in s.notes:
                console.print(f"  stage {s.index} ({s.name}): {one_line(note, limit=sys.maxsize)}", markup=False)
        if g.kernels or any(s.name.startswith("post-grad") for s in p.stages):  # aot_eager: no kernels
            console.print(kernel_table(g))
        if g.not_fused:
            from fxviz.analyze.inside.overlay import not_fused_lines

            console.print(f"not fused ({len(g.not_fused)}, Inductor's reasons):", markup=False)
            for line in not_fused_lines(g):
                console.print(line, markup=False)
        from fxviz.analyze.inside.overlay import unmapped_note

        unmapped = unmapped_note(g)
        if unmapped:
            console.print(one_line(unmapped, limit=400), markup=False)
        table = cost_table(g)
        if table is not None:
            console.print(table)
        part = partition_table(g)
        if part is not None:
            console.print(part)


#: What ``--graph`` names: a graph id (``g0``; ``b0``, a compiled backward) or torch's compile id
#: (``0/1``, ``0/1_1`` for a second attempt, ``!0/0/1`` under compiled autograd, ``rank 1: 0/0`` in a
#: trace of several ranks).
GRAPH_SYNTAX = re.compile(r"[gb]\d+|(rank \d+: )?!?\d+(/\d+){0,2}(_\d+)?")


def check_graph_syntax(graph: str | None) -> None:
    """Refuse a ``--graph`` that can name no compiled graph, before anything is compiled or read."""
    if graph is not None and not GRAPH_SYNTAX.fullmatch(graph):
        raise TargetError(f"--graph {graph!r} names no compiled graph: give a graph id (g0, g1, ...) or a compile "
                          "id (0/0, 1/0, ...)")


def check_selection(inside: Inside, graph: str | None, stage: int | None) -> None:
    """Refuse a ``--graph`` or ``--stage`` the run did not produce, before anything is printed or
    written: which graphs and stages there are is known only once torch compiled (or the trace is
    read), so the line lists them."""
    if graph is None and stage is None:
        return
    g = pick(inside, graph)
    if stage is not None and not 0 <= stage < len(g.pipeline.stages):
        names = ", ".join(f"{s.index} {s.name}" for s in g.pipeline.stages)
        raise TargetError(f"--stage {stage}: {g.id} ({g.compile_id}) has stages 0 to {len(g.pipeline.stages) - 1} "
                          f"({names})")


def pick(inside: Inside, graph: str | None) -> InsideGraph:
    if not inside.graphs:
        raise TargetError("the trace holds no compiled graph with Inductor's records (was it compiled with "
                          "backend='inductor', with TORCH_TRACE set?)")
    if graph is None:
        return inside.graphs[0]
    try:
        return inside.graph(graph)
    except KeyError:
        valid = ", ".join(f"{g.id} ({g.compile_id})" for g in inside.graphs)
        raise TargetError(f"--graph {graph}: the run compiled {len(inside.graphs)} graph"
                          f"{'s' if len(inside.graphs) != 1 else ''}: {valid}") from None


def stage_report(inside: Inside, graph: str | None, stage: int | None) -> Graph:
    """A stage's graph for the report when there is no eager graph: the stage table as its panel,
    the kernels and costs panels beside it (default: the last stage of the first graph)."""
    from fxviz.analyze.inside.overlay import panels
    from fxviz.analyze.pipeline.views import annotate

    g = pick(inside, graph)
    index = len(g.pipeline.stages) - 1 if stage is None else stage
    if not 0 <= index < len(g.pipeline.stages):
        raise TargetError(f"--stage {index}: {g.id} has stages 0 to {len(g.pipeline.stages) - 1}")
    out = annotate(g.pipeline, index, show_unchanged=True)
    panels(out, inside)
    return out


__all__ = ["GRAPH_SYNTAX", "KERNEL_ROWS", "check_graph_syntax", "check_selection", "cost_table", "kernel_table", "partition_table", "pick", "print_inside", "stage_report"]
