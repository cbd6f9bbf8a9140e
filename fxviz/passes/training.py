"""The overlays of a training step (``capture(backward=True)``), derived from the IR on every read
like the other built-in overlays (:mod:`fxviz.passes.overlays`). No torch.

* ``phase``: a category per node, ``forward`` / ``backward`` / ``recompute``; a module call whose ops
  are all of one phase shows it.
* ``saved``: bytes of saved activations (``Graph.saved``) per forward op that saved them, and per
  module call the total over the ops inside it, any depth; ``saved_own``: per module call the
  bytes saved in it, not in its submodules (by its own ops, and what a ``torch.utils.checkpoint`` call
  it makes keeps to run its region again: torch packs those while the caller runs, ``Saved.module``).
  Both add up to the records' bytes exactly.
"""

from __future__ import annotations

from typing import Any

from fxviz.calls import Call, CallTree
from fxviz.ir import Graph

_PHASE_COLORS = {"forward": "#4e79a7", "backward": "#e15759", "recompute": "#f28e2b"}


def phase_overlay(graph: Graph, tree: CallTree) -> dict[str, Any]:
    """The phase of each op and output; empty for a forward-only graph."""
    if all(n.phase == "forward" for n in graph.nodes):
        nodes: dict[str, str] = {}
    else:
        nodes = {n.name: n.phase for n in graph.nodes if n.kind in ("op", "output", "input")}
    return {"label": "phase", "kind": "category", "mixed": "both",
            "description": "forward or backward pass of the training step (capture(backward=True))",
            "categories": {k: {"label": k, "color": c} for k, c in _PHASE_COLORS.items()}
            | {"both": {"label": "forward and backward", "color": "#bab0ac"}},
            "nodes": nodes, "modules": {}}


def saved_bytes(graph: Graph) -> dict[str, int]:
    """Saved bytes per node that saved something (records of zero bytes leave a 0)."""
    out: dict[str, int] = {}
    for s in graph.saved:
        out[s.node] = out.get(s.node, 0) + s.bytes
    return out


def _own_call(tree: CallTree, node: str, module: str) -> Call:
    """The call a record is the own saving of: of its op's calls, inner to outer, the one of the record's
    module (``Saved.module``: a checkpoint's inputs are its caller's, saved by the region's first op),
    else the op's own call."""
    own = tree.of(node)
    call: Call | None = own
    while call is not None and call.path != module:
        call = call.parent
    return call if call is not None else own


def saved_overlay(graph: Graph, tree: CallTree) -> dict[str, Any]:
    """Saved-activation bytes per op, and per module call with its submodules (the records saved in it,
    :func:`saved_own_overlay`, and in the calls inside it)."""
    nodes = saved_bytes(graph)
    modules: dict[str, int] = {}
    if nodes:
        modules = {c.id: 0 for c in tree.walk() if c.stack}
        for s in graph.saved:
            c: Call | None = _own_call(tree, s.node, s.module)
            while c is not None and c.stack:
                modules[c.id] += s.bytes
                c = c.parent
    return {"label": "saved bytes", "kind": "number", "unit": "B", "scale": "log", "reduce": "sum",
            "description": "bytes autograd keeps for the backward (each storage once; parameters, inputs and "
                           "views of counted storage cost 0): per op that saved them, per module with its submodules",
            "nodes": nodes, "modules": modules}


def saved_own_overlay(graph: Graph, tree: CallTree) -> dict[str, Any]:
    """Saved-activation bytes per module call, its own ops only: a record counts in the call of its
    module (:attr:`Saved.module`, as the summary and the panel say), which is its op's own call but
    for what a checkpoint keeps to run its region again (its caller's)."""
    nodes = saved_bytes(graph)
    modules: dict[str, int] = {}
    if nodes:
        modules = {c.id: 0 for c in tree.walk() if c.stack}
        for s in graph.saved:
            c = _own_call(tree, s.node, s.module)
            if c.stack:
                modules[c.id] += s.bytes
    return {"label": "saved bytes (own ops)", "kind": "number", "unit": "B", "scale": "log",
            "description": "bytes autograd keeps for the backward, saved in a module itself (not its submodules): by "
                           "its own ops, and the inputs a torch.utils.checkpoint it calls keeps to run its region again",
            "nodes": nodes, "modules": modules}


def checkpoint_saved_overlay(graph: Graph, tree: CallTree) -> dict[str, Any]:
    """Bytes activation checkpointing saved: per forward op of a checkpoint region what it would have
    kept for the backward without checkpoint (``attrs["would_save"]``: every op of the region, whether
    the backward runs it again or its early stop skips it), per module call with its submodules."""
    nodes = {n.name: int(n.attrs["would_save"]) for n in graph.nodes if n.phase == "forward" and "would_save" in n.attrs}
    modules = {c.id: sum(nodes.get(x, 0) for x in c.nodes) for c in tree.walk() if c.stack} if nodes else {}
    return {"label": "checkpoint saved", "kind": "number", "unit": "B", "scale": "log", "reduce": "sum",
            "description": "bytes torch.utils.checkpoint saved: what the checkpointed forward ops would have kept "
                           "for the backward without it (per op, per module with its submodules)",
            "nodes": nodes, "modules": modules}


def _size(n: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


_WHY = {"parameter": "a parameter", "buffer": "a buffer", "input": "an input", "view": "a view of a counted storage"}


def saved_summary(graph: Graph) -> str:
    """The saved activations in one sentence: total bytes and the module whose ops saved the most
    (``""`` for a graph with no records)."""
    if not graph.saved:
        return ""
    per: dict[str, int] = {}
    for s in graph.saved:
        per[s.module] = per.get(s.module, 0) + s.bytes
    total = sum(per.values())
    top = max(per, key=lambda m: per[m])
    where = f"; most in {top or 'the model itself'} ({_size(per[top])})" if per[top] else ""
    op, alive = saved_at_peak(graph)
    at = ""
    if alive:
        top3 = ", ".join(f"{m or 'the model itself'} {_size(b)}" for m, b in alive[:3])
        more = f", {len(alive) - 3} more modules" if len(alive) > 3 else ""
        at = f"; peak {_size(sum(b for _, b in alive))} after {op} ({top3}{more})"
    return f"{_size(total)} of saved activations ({total:,} bytes, {len(graph.saved)} tensors){where}{at}"


def _spans(graph: Graph) -> tuple[list[str], list[tuple[int, int, Any]]]:
    """The step's ops in graph order, and per record that costs bytes the ops it is alive over
    (inclusive): from the op that saved it to the last backward op that reads its value (to the
    end when none does)."""
    ops = [n for n in graph.nodes if n.kind == "op"]
    at = {n.name: k for k, n in enumerate(ops)}
    last: dict[str, int] = {}
    for k, n in enumerate(ops):
        if n.phase != "forward":
            for r in n.inputs:
                last[r.node] = k
    spans = []
    for s in graph.saved:
        if not s.bytes or s.node not in at:
            continue
        start = at[s.node]
        spans.append((start, max(last.get(s.value or s.node, len(ops) - 1), start), s))
    return [n.name for n in ops], spans


def saved_timeline(graph: Graph) -> list[tuple[str, int]]:
    """Saved-activation bytes alive after each op of the step, in graph order (forward, then
    backward): a record counts from the op that saved it until the last backward op that reads
    its value (to the end when none does). Empty for a graph with no records."""
    if not graph.saved:
        return []
    ops, spans = _spans(graph)
    delta = [0] * (len(ops) + 1)
    for start, end, s in spans:
        delta[start] += s.bytes
        delta[end + 1] -= s.bytes
    out, live = [], 0
    for k, name in enumerate(ops):
        live += delta[k]
        out.append((name, live))
    return out


def saved_at_peak(graph: Graph) -> tuple[str, list[tuple[str, int]]]:
    """The op after which the most saved bytes are alive (the first, on a tie), and those bytes
    per module of the ops that saved them, most first (``("", [])`` with nothing saved). The
    modules' bytes add up to the timeline's peak."""
    line = saved_timeline(graph)
    if not line or not max(b for _, b in line):
        return "", []
    k = max(range(len(line)), key=lambda i: (line[i][1], -i))
    per: dict[str, int] = {}
    for start, end, s in _spans(graph)[1]:
        if start <= k <= end:
            per[s.module] = per.get(s.module, 0) + s.bytes
    return line[k][0], sorted(per.items(), key=lambda x: (-x[1], x[0]))


def saved_panel(graph: Graph) -> dict[str, Any] | None:
    """The panel of saved activations (the shape :func:`fxviz.passes.panels.set_panel` writes), one
    row per :attr:`Graph.saved` record pointing at the op that saved it; ``None`` when there are none.
    Derived on every read, never written on the graph."""
    if not graph.saved:
        return None
    rows = []
    for s in graph.saved:
        why = _WHY.get(s.shares, s.shares) if s.shares else ""
        why += (", " if why else "") + "inferred" if s.inferred else ""
        rows.append({"cells": [s.node, s.module or "(model)", "×".join(str(d) for d in s.shape) or "scalar",
                               s.dtype, s.bytes, why], "node": s.node})
    return {"title": "saved activations", "columns": ["op", "module", "shape", "dtype", "bytes", "costs 0: why"],
            "rows": rows, "note": saved_summary(graph)}


__all__ = ["checkpoint_saved_overlay", "phase_overlay", "saved_bytes", "saved_overlay", "saved_own_overlay",
           "saved_at_peak", "saved_panel", "saved_summary", "saved_timeline"]
