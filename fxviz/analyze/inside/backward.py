"""The modules of a compiled backward's kernels, from the parameters their ops touch. No torch.

torch 2.13 records no kernel -> node mapping for the backward, and its nodes carry only the
forward's source line, so :mod:`.build` gives a backward kernel every module whose ops run on
that line: on GPT-2, one ``mm`` of the backward belongs to all eight ``Conv1D`` calls (they share
``pytorch_utils.py``'s ``addmm`` line). What the backward graph itself says is sharper: an op that
reads a parameter (through views: ``mm(grad, permute(primals_4))``, the gradient of a Linear's input)
or whose value becomes a parameter's gradient (through views: ``view(sum(grad))`` returned as the
gradient of ``PlainAOTInput(idx=3)``) belongs to that parameter's module. :func:`narrow` gives each
other node whose line runs ops of several sibling modules (``h.0.mlp.act``, ``h.1.mlp.act``) the
one nearest to what it reads (a forward value torch saved or recomputed, a parameter);
:func:`refine` gives each backward kernel whose ops all read or make a parameter's gradient
exactly those parameters' modules. Checked against torch's per-node ``fwd_nn_module_stack`` in
tests/test_compile_backward_kernels.py.

That is the fallback. A live run writes torch's own module of each post-grad node into the trace
(the :data:`~fxviz.tracefile.records.NODE_MODULES` artifact, :mod:`fxviz.torchbridge.modulerecord`):
:func:`recorded` reads it, and where a kernel's nodes have it, :func:`apply_record` gives the kernel
exactly the modules torch gives its nodes. The heuristic serves only nodes and kernels without it (a
user's plain ``TORCH_TRACE``, ``--from-trace``; a graph Inductor's FX graph cache served).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from fxviz.analyze.inside.kernels import is_view, short
from fxviz.analyze.inside.stages import primal_index
from fxviz.ir import Graph, Node
from fxviz.tracefile.records import NODE_MODULES

if TYPE_CHECKING:
    from fxviz.analyze.inside.result import InsideGraph, Kernel
    from fxviz.tracefile.records import Compile

_GRAD = re.compile(r"GradAOTOutput\(grad_of=\w+\(idx=(\d+)\)\)")
#: Ops that only move a gradient on its way to the output (no work of their own).
_PASS = frozenset({"clone", "_to_copy", "copy"})
#: What the notes of a backward say of its kernels' modules: torch's record gave them, or fxviz inferred them.
FROM_TORCH = "kernels' modules from torch's fwd_nn_module_stack"
INFERRED_MODULES = "kernels' modules inferred"
#: The meta keys of a node's module stack in the record, the first a node has wins (a backward node's
#: ``fwd_nn_module_stack``; a recomputed forward op's own ``nn_module_stack``).
_KEYS = ("fwd_nn_module_stack", "nn_module_stack")


def module_path(path: str) -> str:
    """torch's module path as fxviz writes it: ``L['self'].h[0].mlp`` and
    ``L['self']._modules['h']._modules['0'].mlp`` -> ``h.0.mlp``; ``L['self']`` -> ``""``."""
    path = re.sub(r"^L\['self'\]\.?", "", path)
    path = re.sub(r"\._modules\['([^']+)'\]|\[(\d+)\]", lambda m: "." + (m.group(1) or m.group(2)), "." + path)
    return path.lstrip(".")


def recorded(c: Compile, part: str, nth: int = 0, graph: str = "post-grad") -> dict[str, str] | None:
    """Post-grad node (with ``graph="aot"``: AOT Autograd graph node) -> the module torch gives it
    (its innermost stack entry), from the ``nth`` :data:`NODE_MODULES` record of ``part`` and
    ``graph`` in compile ``c``; ``None`` when there is none."""
    recs = [a.payload for a in c.all(NODE_MODULES) if isinstance(a.payload, dict) and a.payload.get("part") == part
            and a.payload.get("graph", "post-grad") == graph]
    if nth >= len(recs):
        return None
    out: dict[str, str] = {}
    for key in reversed(_KEYS):
        for node, stack in (recs[nth].get(key) or {}).items():
            if isinstance(stack, list) and stack and isinstance(stack[-1], list) and stack[-1]:
                out[str(node)] = module_path(str(stack[-1][0]))
    return out


def keep_recorded(lines: dict[str, list[str]], record: Mapping[str, str], module: Callable[[str], str | None]) -> None:
    """Narrow each ``lines`` entry of a recorded node to the Dynamo nodes of the module torch gives
    it (left as it is where none is: :func:`narrow` takes it). In place."""
    for name, cands in lines.items():
        if name in record:
            mine = [d for d in cands if module(d) == record[name]]
            if mine:
                lines[name] = mine


def apply_record(kernels: list[Kernel], record: Mapping[str, str]) -> int:
    """Give each kernel with a node in ``record`` exactly the modules torch gives its nodes (nodes
    without a stack, a fill or a view torch made, add none); how many kernels it gave modules."""
    n = 0
    for k in kernels:
        mods = list(dict.fromkeys(record[o] for o in k.ops if o in record))
        if mods:
            k.modules = mods
            n += 1
    return n


def param_modules(graphs: dict[str, Graph]) -> dict[str, str]:
    """Backward node -> the module of the parameter it reads or whose gradient it is (only the
    nodes with one such module)."""
    aot, dyn = graphs.get("AOT backward"), graphs.get("Dynamo graph")
    if aot is None or dyn is None:
        return {}
    return _param_modules(aot, dyn, graphs.get("post-grad passes (backward)") or aot, graphs.get("AOT forward"))[1]


def _param_modules(aot: Graph, dyn: Graph, graph: Graph, fwd: Graph | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """(parameter placeholder -> its module, node -> the module of the parameter it reads or whose
    gradient it is) in ``graph``, a backward graph ``aot`` annotates. A placeholder is a parameter
    (its AOT descriptor: a primal, or a tensor subclass primal's inner tensor, a DTensor's local
    shard) or a view of one the forward ``fwd`` saved (the partitioner may save ``permute(W)``
    rather than ``W``: DTensor's linear does)."""
    inputs = [n for n in dyn.nodes if n.kind in ("input", "parameter", "buffer")]

    def module_of(idx: int) -> str | None:
        d = inputs[idx] if idx < len(inputs) else None
        return d.stack[-1][0] if d is not None and d.kind == "parameter" and d.stack else None

    fwd_nodes = {n.name: n for n in fwd.nodes} if fwd is not None else {}
    owner: dict[str, str] = {}  # placeholder -> its parameter's module
    for p in aot.nodes:
        if p.kind != "input":
            continue
        idx = primal_index(p.attrs.get("aot"))
        if idx is None and p.name in fwd_nodes:  # a saved forward value: a view of a primal?
            base = fwd_nodes.get(_base(fwd_nodes[p.name], fwd_nodes))
            idx = primal_index(base.attrs.get("aot")) if base is not None and base.kind == "input" else None
        mod = module_of(idx) if idx is not None else None
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
    return owner, found


def narrow(post: Graph, lines: dict[str, list[str]], exact: Mapping[str, Sequence[str]],
           module: Callable[[str], str | None], aot: Graph | None = None, dyn: Graph | None = None,
           fwd: Graph | None = None) -> None:
    """Narrow each ``lines`` entry (a backward node -> the Dynamo nodes on its source line) whose
    Dynamo nodes belong to more than one module to those of the module nearest to what the node
    reads: walking its inputs breadth first, the first values whose module is known (a forward
    value or recomputed forward node of ``exact``, a parameter, an op reading one, a node already
    narrowed or on a line of one module) and that tell the candidates apart (the most leading path
    parts in common: the GELU backward reading ``h.1.mlp.act``'s recomputed ``mul`` is
    ``h.1.mlp.act``'s, not ``h.0``'s). Nodes are taken in graph order, so a narrowed node tells its
    users; those their inputs leave open are then taken by their users, last first. In place."""
    known: dict[str, set[str]] = {}
    for name, pre in exact.items():
        mods = {m for d in pre if (m := module(d)) is not None}
        if mods:
            known[name] = mods
    if aot is not None and dyn is not None:
        owner, found = _param_modules(aot, dyn, post, fwd)
        for name, m in {**owner, **found}.items():
            known[name] = {m}
    nodes = {n.name: n for n in post.nodes}
    reads = {name: [r.node for r in n.inputs] for name, n in nodes.items()}
    users: dict[str, list[str]] = {}
    for name, n in nodes.items():
        for r in n.inputs:
            users.setdefault(r.node, []).append(name)
    order = [n.name for n in post.nodes if n.name in lines]
    left = []
    for name in order:  # by what each node reads, in graph order: a narrowed node tells its users
        if not _narrow(name, lines, known, module, reads):
            left.append(name)
    for name in reversed(left):  # then by what reads it (a zero fill its scatter fills)
        _narrow(name, lines, known, module, users)


def _narrow(name: str, lines: dict[str, list[str]], known: dict[str, set[str]], module: Callable[[str], str | None],
            edges: Mapping[str, list[str]]) -> bool:
    """Narrow ``lines[name]`` by the values ``edges`` lead to; whether it is settled."""
    cands = {d: m for d in lines[name] if (m := module(d)) is not None}
    mods = set(cands.values())
    if len(mods) < 2:
        known.setdefault(name, mods) if mods else None
        return True
    best = (known[name] & mods) if name in known else _nearest(edges, name, mods, known)
    # a module and its parent on one line (``gelu(self.fc1(x))``): what the op reads (fc1's
    # output) does not tell which of them it differentiates, so both stay
    best = {m for m in mods if any(_nested(m, b) for b in best)}
    if best and best != mods:
        lines[name] = [d for d, m in cands.items() if m in best]
        known[name] = best
        return True
    return False


def _nearest(edges: Mapping[str, list[str]], start: str, mods: set[str], known: dict[str, set[str]],
             depth: int = 6) -> set[str]:
    """The candidate modules ``mods`` nearest, along ``edges``, to a value whose module is ``known``."""
    frontier, seen = [start], {start}
    for _ in range(depth):
        hits: set[str] = set()
        nxt: list[str] = []
        for x in frontier:
            for y in edges.get(x, ()):
                if y in seen:
                    continue
                seen.add(y)
                if y in known:
                    hits |= known[y]
                else:
                    nxt.append(y)
        score = {m: max((_common(m, h) for h in hits), default=0) for m in mods}
        top = max(score.values(), default=0)
        best = {m for m, v in score.items() if v == top}
        if top > 0 and best != mods:
            return best
        frontier = nxt
        if not frontier:
            break
    return set()


def _nested(a: str, b: str) -> bool:
    """``a`` is ``b``, or inside it, or holds it (``""`` is the model itself)."""
    return a == b or not a or not b or a.startswith(b + ".") or b.startswith(a + ".")


def _common(a: str, b: str) -> int:
    """Leading module path parts ``a`` and ``b`` share (``h.1.attn``, ``h.1.mlp`` -> 2; the model
    itself, ``""``, shares none: it holds every candidate alike)."""
    if not a or not b:
        return 0
    n = 0
    for x, y in zip(a.split("."), b.split("."), strict=False):
        if x != y:
            break
        n += 1
    return n


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


def refine(ig: InsideGraph, record: Mapping[str, str] | None = None) -> None:
    """Give each backward kernel whose computing ops all have a parameter's module exactly those
    modules (see the module's docstring); not a kernel with a node torch's ``record`` has."""
    graphs = {s.name: s.graph for s in ig.pipeline.stages}
    found = param_modules(graphs)
    if not found:
        return
    post = graphs.get("post-grad passes (backward)")
    nodes = {n.name: n for n in post.nodes} if post is not None else {}
    for k in ig.kernels:
        if k.part != "backward" or not k.ops or any(o in (record or {}) for o in k.ops):
            continue
        work = [o for o in k.ops if o in nodes and not is_view(nodes[o])] or list(k.ops)
        if all(o in found for o in work):
            k.modules = list(dict.fromkeys(found[o] for o in work))


__all__ = ["FROM_TORCH", "INFERRED_MODULES", "apply_record", "keep_recorded", "module_path", "narrow", "param_modules",
           "recorded", "refine"]
