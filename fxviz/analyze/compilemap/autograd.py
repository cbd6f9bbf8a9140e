"""The backward under compiled autograd, as plain data. No torch.

With ``compile_map(..., grad=True, compiled_autograd=True)`` the first input set's backward runs
under compiled autograd (``torch._dynamo.compiled_autograd._enable`` with the map's recording
backend, what ``torch._dynamo.config.compiled_autograd = True`` does inside a compiled training
step): the autograd engine traces the backward into one graph per capture, and Dynamo compiles
that graph, breaking it where a backward hook or a custom ``autograd.Function.backward`` does what
Dynamo cannot trace (``print``, ``.item()``).

:func:`autograd_graphs` reads torch's own record of each captured graph: the
``compiled_autograd_graph`` artifact of the structured trace (compile id ``!0``; the Dynamo graphs
compiled from it are ``!0/1/0``, ...), whose nodes torch heads with the autograd node they run
(``# ... code: AddmmBackward0 (NodeCall 2)``). :func:`assign_modules` gives each node call the
module of the eager backward op of the same autograd node (the eager tracer's backward, in the
engine's order, :func:`fxviz.fallback.backward.trace_backward`); a ``CompiledFunctionBackward``
(the backward of a graph AOT Autograd compiled) the modules of the eager backward ops it stands for.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from fxviz.analyze.compilemap.overlay import break_lines, break_panel
from fxviz.analyze.compilemap.result import (
    AutogradGraph,
    CompiledBackward,
    CompileMap,
    NodeCall,
    plural,
)
from fxviz.passes.panels import row, set_panel
from fxviz.tracefile.records import Trace

_CALL = re.compile(r"code: (\S+) \(NodeCall (\d+)\)")
_AOT = re.compile(r"CompiledFunctionBackward\d*")  # torch appends the AOT id
#: The engine's own nodes: the root it starts from and the gradients' accumulation into leaves.
ENGINE = frozenset({"torch::autograd::GraphRoot", "torch::autograd::AccumulateGrad"})


def autograd_graphs(trace: Trace) -> list[AutogradGraph]:
    """Each ``compiled_autograd_graph`` torch recorded, with the autograd nodes it runs in order."""
    out = []
    for c in trace.compiles:
        if c.compiled_autograd_id is None:
            continue
        for a in c.all("compiled_autograd_graph"):
            calls = [NodeCall(m.group(1), int(m.group(2))) for m in _CALL.finditer(str(a.payload))]
            out.append(AutogradGraph(c.compiled_autograd_id, calls))
    return out


def assign_modules(graphs: Sequence[AutogradGraph], eager: Sequence[tuple[str, str]]) -> None:
    """Give each node call the modules whose forward its autograd node differentiates. ``eager`` is
    the eager backward's ops in the engine's order, each ``(autograd node name, module path)``
    (``""``: the model itself). A node call takes the next eager op of its name (both run in the
    engine's order); a ``CompiledFunctionBackward`` (the backward of a graph AOT Autograd compiled,
    one node for many) takes the modules of the eager ops it stands for: those up to the eager op of
    the next node call matched."""
    for g in graphs:
        at = 0
        pending: list[NodeCall] = []
        for c in g.calls:
            if c.name in ENGINE:
                continue
            if _AOT.fullmatch(c.name):
                pending.append(c)
                continue
            j = next((k for k in range(at, len(eager)) if eager[k][0] == c.name), None)
            if j is None:
                continue
            _give(pending, eager[at:j])
            pending = []
            c.modules = [eager[j][1]]
            at = j + 1
        _give(pending, eager[at:])


def _give(calls: Sequence[NodeCall], ops: Sequence[tuple[str, str]]) -> None:
    mods = list(dict.fromkeys(m for _, m in ops))
    for c in calls:
        c.modules = mods


def write_backward(cmap: CompileMap) -> None:
    """The backward's panels on the map's graph: ``backward breaks`` (grouped by cause and line, as
    the forward's ``breaks``) and ``compiled autograd`` (each captured graph's autograd nodes with
    their modules); the headline says what the backward did."""
    back, graph = cmap.backward, cmap.graph
    if back is None:
        return
    if back.breaks:
        break_panel(graph, "backward breaks", "graph breaks in the backward (compiled autograd)", back.breaks,
                    f"{plural(back.break_count, 'break')}, {plural(len(back.breaks), 'cause')}")
    set_panel(graph, "compiled autograd", title="compiled autograd: the backward's autograd nodes",
              columns=["graph", "call", "autograd node", "modules"],
              rows=[row(f"!{g.id}", c.call, c.name, ", ".join(m or "(model)" for m in c.modules) or None,
                        level="ok" if c.modules or c.name in ENGINE else "warn")
                    for g in back.autograd for c in g.calls],
              note=back.summary())
    head = graph.annotations.get("headline")
    if isinstance(head, dict):
        head["text"] = cmap.headline()
        if back.breaks and head.get("level") == "ok":
            head["level"] = "warn"


def backward_lines(back: CompiledBackward) -> list[str]:
    """The terminal's account of the backward under the ``backward breaks`` panel: its summary, each
    break's place (as the forward's, :func:`~fxviz.analyze.compilemap.overlay.break_lines`), each
    captured graph's autograd nodes with their modules."""
    out = [back.summary()]
    out += ["  " + line for line in break_lines(back.breaks)]
    for g in back.autograd:
        calls = [c for c in g.calls if c.name not in ENGINE]
        out.append(f"  compiled autograd graph !{g.id}: {len(calls)} autograd nodes")
        out += [f"    {c.name:<28} {', '.join(m or '(model)' for m in c.modules) or '?'}" for c in calls]
    return out

__all__ = ["ENGINE", "assign_modules", "autograd_graphs", "backward_lines", "write_backward"]
