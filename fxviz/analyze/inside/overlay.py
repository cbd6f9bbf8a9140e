"""What happens inside torch.compile, written on the eager graph: overlays and panels every
renderer shows. No torch.

* overlay ``kernel`` (category): per eager op the kernel (or extern call) that runs most of it,
  forward first; per module call its one kernel, or ``several kernels``;
* overlay ``kernel time`` (number, µs): per eager op its share of the time of the kernels that run
  it (a kernel's time split evenly over the eager ops it runs), summed per module call;
* panels ``kernels`` (every kernel and extern call, slowest first: kind, graph, part, eager ops,
  modules, time, share; a fusion across modules marked), ``stages`` (each compiled graph's stage
  table, as ``fxviz passes`` prints it) and ``compile cost`` (torch's compile metrics, the phases
  and the cache outcomes per graph);
* with a backward graph, overlay ``backward saves`` and panel ``partition``
  (:func:`fxviz.analyze.inside.partition.write`).
"""

from __future__ import annotations

from typing import Any

from fxviz.analyze.inside.costs import cost_rows
from fxviz.analyze.inside.partition import write as write_partition
from fxviz.analyze.inside.result import Inside, Kernel
from fxviz.analyze.pipeline.views import stage_cells, stage_keys
from fxviz.ir import Graph
from fxviz.passes.overlays import set_overlay
from fxviz.passes.panels import row, set_panel

KERNEL, KERNEL_TIME = "kernel", "kernel time"
SEVERAL = "several kernels"
_PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6", "#9d755d",
            "#bab0ac", "#1f77b4", "#2ca02c", "#17becf", "#d62728", "#9467bd", "#8c564b")
#: Rows of the kernels panel (the JSON keeps every kernel).
KERNEL_ROWS = 200


def label(k: Kernel) -> str:
    """How the tree and report name a kernel: ``cpp_fused_gelu_0`` (``g0``), ``extern addmm``."""
    name = f"extern {k.name.rsplit('.', 1)[-1]}" if k.kind == "extern" else k.name
    return f"{name} ({k.graph}{'' if k.part in ('forward', 'inference', '') else ' ' + k.part})"


def by_time(kernels: list[Kernel]) -> list[Kernel]:
    """Slowest first; kernels without a time after, in their order."""
    return sorted(kernels, key=lambda k: -(k.time_us if k.time_us is not None else -1.0))


def write(graph: Graph, inside: Inside) -> Graph:
    """Write the overlays and panels of ``inside`` on the eager ``graph``."""
    ops = {n.name for n in graph.nodes if n.kind == "op"}
    owner: dict[str, tuple[int, Kernel]] = {}  # eager op -> (how many of its post-grad nodes, kernel)
    time: dict[str, float] = {}
    for k in inside.kernels:
        mine = [e for e in k.eager if e in ops]
        for e in mine:
            weight = len(k.ops) + (1000 if k.part != "backward" else 0)
            if e not in owner or weight > owner[e][0]:
                owner[e] = (weight, k)
            if k.time_us is not None:
                time[e] = time.get(e, 0.0) + k.time_us / len(mine)
    nodes = {e: label(k) for e, (_, k) in owner.items()}
    categories = {}
    for i, key in enumerate(dict.fromkeys(nodes.values())):
        categories[key] = {"label": key, "color": _PALETTE[i % len(_PALETTE)]}
    modules: dict[str, Any] = {}
    mtime: dict[str, float] = {}
    for call in graph.calls.walk():
        if not call.id:
            continue
        inner = {nodes[n] for n in call.nodes if n in nodes}
        if len(inner) == 1:
            modules[call.id] = next(iter(inner))
        elif inner:
            modules[call.id] = SEVERAL
        t = sum(time.get(n, 0.0) for n in call.nodes)
        if t:
            mtime[call.id] = round(t, 3)
    if SEVERAL in modules.values():
        categories[SEVERAL] = {"label": "several kernels", "color": "#c7c7c7"}
    if nodes:
        set_overlay(graph, KERNEL, label="kernel", kind="category", nodes=nodes, modules=modules,
                    categories=categories, description=f"the Inductor kernel that runs each op: {inside.summary()}")
    if time:
        set_overlay(graph, KERNEL_TIME, label="kernel time", kind="number", unit="µs",
                    nodes={k: round(v, 3) for k, v in time.items()}, modules=mtime, reduce="sum",
                    description="measured time (torch.profiler, per forward) of the kernels that run each op, a "
                                "kernel's time split evenly over the ops it runs")
    panels(graph, inside)
    write_partition(graph, [g.partition for g in inside.graphs if g.partition is not None])
    return graph


def panels(graph: Graph, inside: Inside) -> None:
    ops = {n.name for n in graph.nodes if n.kind == "op"}
    ks = by_time(inside.kernels)
    rows = []
    for k in ks[:KERNEL_ROWS]:
        first = next((e for e in k.eager if e in ops), None)
        mods = ", ".join(m or "(model)" for m in k.modules) + (" (crosses modules)" if k.crosses_modules else "")
        rows.append(row(k.name, k.kind, k.graph, k.part, len(k.ops), ", ".join(k.eager[:8]) or None, mods or None,
                        f"{k.time_us:.1f} µs" if k.time_us is not None else None,
                        f"{k.share * 100:.1f}%" if k.share is not None else None,
                        node=first, level="warn" if k.crosses_modules else "info" if k.inferred else "ok",
                        sort=[None, None, None, None, len(k.ops), None, None, k.time_us,
                              k.share * 100 if k.share is not None else None]))
    if rows:
        set_panel(graph, "kernels", title="Inductor kernels",
                  columns=["kernel", "kind", "graph", "part", "post-grad ops", "eager ops", "modules", "time", "share"],
                  rows=rows, note=inside.summary() + ("" if len(ks) <= KERNEL_ROWS else f"; the slowest {KERNEL_ROWS} shown"))
    srows = []
    for g in inside.graphs:
        for s in g.pipeline.stages:
            srows.append(row(g.id, *stage_cells(s)[:6], level="ok" if s.changed else "info",
                             sort=[None, *stage_keys(s)[:6]]))
    if srows:
        set_panel(graph, "stages", title="Inductor stages",
                  columns=["graph", "#", "stage", "time", "ops", "+added", "-removed"], rows=srows,
                  note="each compiled graph's stages, from torch's own graphs (fxviz compile --inside --stage N shows one)")
    crows = [row(c.graph, what, value) for c in inside.costs for what, value in cost_rows(c)]
    if crows:
        set_panel(graph, "compile cost", title="compile cost", columns=["graph", "what", "seconds / outcome"],
                  rows=crows, note="torch's compilation_metrics, its chromium phases and cache lookups")


__all__ = ["KERNEL", "KERNEL_TIME", "by_time", "label", "panels", "write"]
