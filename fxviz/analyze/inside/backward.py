"""The modules of a compiled backward's kernels, from the parameters their ops touch. No torch.

torch 2.13 records no kernel -> node mapping for the backward, and its nodes carry only the
forward's source line, so :mod:`.build` gives a backward kernel every module whose ops run on
that line: on GPT-2, one ``mm`` of the backward belongs to all eight ``Conv1D`` calls (they share
``pytorch_utils.py``'s ``addmm`` line). What the backward graph itself says is sharper: an op that
reads a parameter (through views: ``mm(grad, permute(primals_4))``, the gradient of a Linear's input)
or whose value becomes a parameter's gradient (through views: ``view(sum(grad))`` returned as the
gradient of ``PlainAOTInput(idx=3)``) belongs to that parameter's module. :func:`refine` gives each
backward kernel whose ops all say so exactly those modules; the others keep the line's.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from fxviz.analyze.inside.kernels import is_view, short
from fxviz.ir import Graph, Node

if TYPE_CHECKING:
    from fxviz.analyze.inside.result import InsideGraph

_GRAD = re.compile(r"GradAOTOutput\(grad_of=\w+\(idx=(\d+)\)\)")
_IDX = re.compile(r"^\w*AOTInput\(idx=(\d+)\)")  # a primal: not TangentAOTInput(output=...(idx=0))
#: Ops that only move a gradient on its way to the output (no work of their own).
_PASS = frozenset({"clone", "_to_copy", "copy"})


def param_modules(graphs: dict[str, Graph]) -> dict[str, str]:
    """Backward node -> the module of the parameter it reads or whose gradient it is (only the
    nodes with one such module)."""
    aot, dyn = graphs.get("AOT backward"), graphs.get("Dynamo graph")
    if aot is None or dyn is None:
        return {}
    graph = graphs.get("post-grad passes (backward)") or aot
    inputs = [n for n in dyn.nodes if n.kind in ("input", "parameter", "buffer")]

    def module_of(idx: int) -> str | None:
        d = inputs[idx] if idx < len(inputs) else None
        return d.stack[-1][0] if d is not None and d.kind == "parameter" and d.stack else None

    owner: dict[str, str] = {}  # placeholder -> its parameter's module
    for p in aot.nodes:
        m = _IDX.match(str(p.attrs.get("aot", ""))) if p.kind == "input" else None
        mod = module_of(int(m.group(1))) if m else None
        if mod is not None:
            owner[p.name] = mod
    grads: dict[str, str] = {}  # node returned as a parameter's gradient -> that module
    out = next((n for n in aot.nodes if n.kind == "output"), None)
    final = next((n for n in graph.nodes if n.kind == "output"), None)
    if out is not None and final is not None:
        notes = [c for c in out.attrs.get("aot", ()) if c.strip() != "None"]
        for ref, note in zip(final.inputs, notes, strict=False):
            m = _GRAD.search(note)
            mod = module_of(int(m.group(1))) if m else None
            if mod is not None:
                grads[ref.node] = mod
    nodes = {n.name: n for n in graph.nodes}
    users: dict[str, list[Node]] = {}
    for n in graph.nodes:
        for r in n.inputs:
            users.setdefault(r.node, []).append(n)
    found: dict[str, str] = {}
    for n in graph.nodes:
        if n.kind != "op":
            continue
        mods = {owner[b] for r in n.inputs if (b := _base(nodes.get(r.node), nodes)) in owner}
        mods |= _downstream(n, users, grads)
        if len(mods) == 1:
            found[n.name] = next(iter(mods))
    return found


def _base(n: Node | None, nodes: dict[str, Node]) -> str:
    while n is not None and n.kind == "op" and is_view(n) and n.inputs:
        n = nodes.get(n.inputs[0].node)
    return n.name if n is not None else ""


def _downstream(n: Node, users: dict[str, list[Node]], grads: dict[str, str]) -> set[str]:
    """The modules whose parameter gradient ``n``'s value becomes, through views only."""
    out: set[str] = set()
    todo, seen = [n], set()
    while todo:
        x = todo.pop()
        if x.name in seen:
            continue
        seen.add(x.name)
        if x.name in grads:
            out.add(grads[x.name])
        todo += [u for u in users.get(x.name, ()) if u.kind == "op" and (is_view(u) or short(u.target) in _PASS)]
    return out


def refine(ig: InsideGraph) -> None:
    """Give each backward kernel whose computing ops all have a parameter's module exactly those
    modules (see the module's docstring)."""
    graphs = {s.name: s.graph for s in ig.pipeline.stages}
    found = param_modules(graphs)
    if not found:
        return
    post = graphs.get("post-grad passes (backward)")
    nodes = {n.name: n for n in post.nodes} if post is not None else {}
    for k in ig.kernels:
        if k.part != "backward" or not k.ops:
            continue
        work = [o for o in k.ops if o in nodes and not is_view(nodes[o])] or list(k.ops)
        if all(o in found for o in work):
            k.modules = list(dict.fromkeys(found[o] for o in work))


__all__ = ["param_modules", "refine"]
