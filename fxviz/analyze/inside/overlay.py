"""What happens inside torch.compile, written on the eager graph: overlays and panels every
renderer shows. No torch.

* overlay ``kernel`` (category): per eager op the kernel (or extern call) that runs most of it,
  forward first; per module call its one kernel, or ``several kernels``;
* overlay ``kernel time`` (number, µs): per eager op its share of the time of the kernels that run
  it (a kernel's time split evenly over the eager ops it runs), summed per module call;
* panels ``kernels`` (every kernel and extern call, slowest first: kind, graph, part, eager ops,
  modules, time, share, the kernels Inductor refused to fuse it with; a fusion across modules
  marked), ``not fused`` (each fusion Inductor refused: both sides' post-grad nodes and kernels, the
  reason torch logged, the modules), ``stages`` (each compiled graph's stage table, as ``fxviz
  passes`` prints it) and ``compile cost`` (torch's compile metrics, the phases and the cache
  outcomes per graph);
* with a backward graph, overlay ``backward saves`` and panel ``partition``
  (:func:`fxviz.analyze.inside.partition.write`).
"""

from __future__ import annotations

from typing import Any

from fxviz.analyze.inside.costs import cost_rows
from fxviz.analyze.inside.partition import write as write_partition
from fxviz.analyze.inside.result import Inside, InsideGraph, Kernel, NotFused
from fxviz.analyze.pipeline.views import stage_cells, stage_keys
from fxviz.ir import Graph
from fxviz.passes.overlays import set_overlay
from fxviz.passes.panels import headline, row, set_headline, set_panel
from fxviz.tracefile.code import ONE_OP

KERNEL, KERNEL_TIME = "kernel", "kernel time"
SEVERAL = "several kernels"
_PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6", "#9d755d",
            "#bab0ac", "#1f77b4", "#2ca02c", "#17becf", "#d62728", "#9467bd", "#8c564b")
#: Rows of the kernels panel a tree prints (a page); the report and the JSON keep every kernel, as the
#: terminal's kernel table says.
KERNEL_ROWS = 25
#: Rows of the not-fused panel a tree prints (a page; the report and the JSON keep every refusal), and
#: the lines the terminal's compile summary prints per graph.
NOT_FUSED_ROWS, NOT_FUSED_LINES = 25, 10


def label(k: Kernel) -> str:
    """How the tree and report name a kernel: ``cpp_fused_gelu_0`` (``g0``), ``extern addmm``."""
    name = f"{k.kind} {_short(k.name)}" if k.kind in ONE_OP else k.name
    return f"{name} ({k.graph}{'' if k.part in ('forward', 'inference', '') else ' ' + k.part})"


def _short(name: str) -> str:
    """``extern_kernels.addmm`` -> ``addmm``; ``torch.ops._c10d_functional.all_reduce_.default`` -> ``all_reduce_``."""
    parts = [p for p in name.split(".") if p not in ("default", "Tensor", "out")]
    return parts[-1] if parts else name


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
    parted = [g for g in inside.graphs if g.partition is not None]
    write_partition(graph, [g.partition for g in parted if g.partition is not None], [g.id for g in parted])
    if not headline(graph):  # read from a trace (no compile map's answer): the summary the terminal prints first
        set_headline(graph, f"inside torch.compile: {inside.summary()}", panel="kernels" if inside.kernels else None,
                     notes=notes(inside), overlay=KERNEL if nodes else None)
    return graph


def notes(inside: Inside) -> list[str]:
    """What the terminal prints under inside's summary: its notes, then each graph's post-grad ops
    without a kernel (:func:`unmapped_note`)."""
    return [*inside.notes, *(n for g in inside.graphs if (n := unmapped_note(g)) is not None)]


def side(ops: list[str], kernels: list[str], names: dict[str, str]) -> str:
    """One side of a refused fusion: ``sum_1 in cpp_fused_sum_0`` (post-grad nodes, their kernels)."""
    what = ", ".join(ops[:4]) + (f" +{len(ops) - 4}" if len(ops) > 4 else "")
    ks = ", ".join(dict.fromkeys(names.get(k, k) for k in kernels)) or "no kernel"
    return f"{what or '?'} in {ks}"


def unmapped_note(g: InsideGraph) -> str | None:
    """The post-grad ops of ``g`` no kernel runs, with the reason (views and ``getitem`` left out:
    Inductor turns those into ``reinterpret_tensor``), as the terminal prints it and the report shows
    it under the headline; ``None`` when there is none."""
    unmapped = [f"{k} ({why})" for k, why in g.unmapped.items() if not why.startswith(("view", "getitem"))]
    return f"{g.id}: post-grad ops without a kernel: {'; '.join(unmapped)}" if unmapped else None


def _names(inside: Inside | InsideGraph) -> dict[str, str]:
    return {k.id: k.name for k in inside.kernels}


def not_fused_lines(g: InsideGraph, limit: int = NOT_FUSED_LINES) -> list[str]:
    """The terminal's short not-fused list of one compiled graph: per refusal, both sides (post-grad
    nodes and kernels), torch's reason and the modules; at most ``limit`` lines, then a count."""
    names = _names(g)
    out = []
    for n in g.not_fused[:limit]:
        mods = ", ".join(m or "(model)" for m in n.modules[:3]) + (f" +{len(n.modules) - 3}" if len(n.modules) > 3 else "")
        out.append(f"  {n.part}: {side(n.first_ops, n.first_kernels, names)} ✗ "
                   f"{side(n.second_ops, n.second_kernels, names)}: {n.reason}" + (f" [{mods}]" if mods else ""))
    if len(g.not_fused) > limit:
        out.append(f"  ... {len(g.not_fused) - limit} more (--json lists every one under 'fusion')")
    return out


def _refused_with(inside: Inside) -> dict[tuple[str, str, str], list[NotFused]]:
    """(graph, part, kernel id) -> the refusals that name the kernel, on either side."""
    out: dict[tuple[str, str, str], list[NotFused]] = {}
    for n in inside.not_fused:
        for k in dict.fromkeys((*n.first_kernels, *n.second_kernels)):
            out.setdefault((n.graph, n.part, k), []).append(n)
    return out


def _other(k: Kernel, n: NotFused, names: dict[str, str]) -> str:
    """The kernels on the other side of refusal ``n`` from kernel ``k`` (``a loop of its own`` when
    both sides run in ``k``: a C++ kernel function runs unfused loop nests one after the other)."""
    mine = n.first_kernels if k.id in n.first_kernels else n.second_kernels
    theirs = n.second_kernels if mine is n.first_kernels else n.first_kernels
    other = [names.get(o, o) for o in dict.fromkeys(theirs) if o != k.id]
    return ", ".join(other) if other else "a loop of its own" if k.id in theirs else "no kernel"


def panels(graph: Graph, inside: Inside) -> None:
    ops = {n.name for n in graph.nodes if n.kind == "op"}
    ks = by_time(inside.kernels)
    names = _names(inside)
    refused = _refused_with(inside)
    rows = []
    for k in ks:
        first = next((e for e in k.eager if e in ops), None)
        mods = ", ".join(m or "(model)" for m in k.modules) + (" (crosses modules)" if k.crosses_modules else "")
        others = [f"{_other(k, n, names)} ({n.reason})" for n in refused.get((k.graph, k.part, k.id), ())]
        rows.append(row(k.name, k.kind_where, k.graph, k.part + (" (inferred)" if k.inferred else ""), len(k.ops), ", ".join(k.eager[:8]) or None, mods or None,
                        f"{k.time_us:.1f} µs" if k.time_us is not None else None,
                        f"{k.share * 100:.1f}%" if k.share is not None else None,
                        "; ".join(dict.fromkeys(others)) or None,
                        node=first, level="warn" if k.crosses_modules else "info" if k.inferred else "ok",
                        sort=[None, None, None, None, len(k.ops), None, None, k.time_us,
                              k.share * 100 if k.share is not None else None, None]))
    if rows:
        spec = set_panel(graph, "kernels", title="Inductor kernels",
                         columns=["kernel", "kind", "graph", "part", "post-grad ops", "eager ops", "modules", "time",
                                  "share", "not fused with"], rows=rows,
                         note=inside.summary())  # the notes (where the modules came from) are the answer's
        spec["page"] = KERNEL_ROWS  # the tree prints the slowest; the report and the JSON every one
    frows = []
    for n in inside.not_fused:
        node = next((e for e in n.eager if e in ops), None)
        frows.append(row(n.graph, n.part, side(n.first_ops, n.first_kernels, names),
                         side(n.second_ops, n.second_kernels, names), n.reason,
                         ", ".join(m or "(model)" for m in n.modules) or None, node=node, level="warn"))
    if frows:
        total = len(inside.not_fused)
        spec = set_panel(graph, "not fused", title="fusions Inductor refused",
                         columns=["graph", "part", "first (post-grad ops in kernel)", "second", "reason (torch's)",
                                  "modules"],
                         rows=frows, note=f"{total} refusal{'s' if total != 1 else ''} logged by Inductor's scheduler "
                                          "(its 'fusion' log), each on the kernels that run its nodes")
        spec["page"] = NOT_FUSED_ROWS  # the tree prints a page; the report and the JSON every refusal
    srows = []
    for g in inside.graphs:
        for s in g.pipeline.stages:
            srows.append(row(g.id, *stage_cells(s)[:6], level="ok" if s.changed else "info",
                             sort=[None, *stage_keys(s)[:6]]))
    if srows:
        said = [f"{g.id} stage {s.index} ({s.name}): {n}" for g in inside.graphs for s in g.pipeline.stages
                for n in s.notes]
        set_panel(graph, "stages", title="Inductor stages",
                  columns=["graph", "#", "stage", "time", "ops", "+added", "-removed"], rows=srows,
                  note="; ".join(["each compiled graph's stages, from torch's own graphs (fxviz compile --inside "
                                  "--stage N shows one)", *said]))
    crows = [row(c.graph, what, value) for c in inside.costs for what, value in cost_rows(c)]
    if crows:
        set_panel(graph, "compile cost", title="compile cost", columns=["graph", "what", "seconds / outcome"],
                  rows=crows, note="torch's compilation_metrics, its chromium phases and cache lookups")


__all__ = ["KERNEL", "KERNEL_TIME", "by_time", "label", "not_fused_lines", "notes", "panels", "side", "unmapped_note",
           "write"]
