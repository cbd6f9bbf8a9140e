"""Provenance between two stages' fx graphs: which node of the earlier graph each node comes from.

Exact where torch recorded it: ``run_decompositions`` gives every node it makes
``meta["from_node"]``, a chain of ``NodeSource`` entries; the entry whose ``graph_id`` is the
earlier graph's names the node (the entries of other graphs, some copied along with meta, are
ignored). A node that keeps its name, op and constant arguments is its own origin (kept). Inferred otherwise: a pass that
builds nodes without meta (most hand-written ones) leaves a new node that takes a removed node's
place; it is tied to the removed nodes whose users it now feeds, else whose inputs it reads, else
to what the new nodes it reads come from.

A new node without a module path or source line (its pass did not copy ``nn_module_stack`` and
``stack_trace``) takes them from the node it comes from (:func:`fill_meta`), and one without a
value (``val``) gets one from running its op on fake tensors (:func:`fill_values`), so every
stage's graph keeps module paths, lines and shapes.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

import torch
import torch.fx
from torch._guards import detect_fake_mode

from fxviz.analyze.pipeline.result import EXACT, INFERRED
from fxviz.ir import Graph

Links = dict[str, list[tuple[str, str]]]
_OPS = ("call_function", "call_method", "call_module")


def _ops(graph: torch.fx.Graph) -> dict[str, torch.fx.Node]:
    return {n.name: n for n in graph.nodes if n.op in _OPS}


def _recorded(node: torch.fx.Node, graph_ids: set[int]) -> list[str]:
    """Names in ``node``'s ``from_node`` chain that belong to one of the graphs ``graph_ids``."""
    found: list[str] = []
    todo = list(node.meta.get("from_node") or [])
    while todo:
        src = todo.pop(0)
        if getattr(src, "graph_id", None) in graph_ids:
            if src.name not in found:
                found.append(src.name)
            continue
        todo.extend(getattr(src, "from_node", None) or [])
    return found


def _constants(n: torch.fx.Node) -> str:
    """``n``'s arguments with every node read left out: what a pass changes when it edits a constant
    (a node whose inputs were replaced upstream is still the same op)."""
    return repr(torch.fx.node.map_arg((n.args, n.kwargs), lambda _: None))


def _same_op(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    return a.target == b.target and _constants(a) == _constants(b)


def link(before: torch.fx.Graph, after: torch.fx.Graph,
         given: torch.fx.Graph | None = None) -> tuple[Links, list[str], list[str]]:
    """(links of every new or changed op node of ``after``, those node names, the op nodes of
    ``before`` that are gone). Kept nodes (same name, same op) are left out of ``links``.
    ``given`` is the copy of ``before`` the pass ran on, if it ran on one (same node names)."""
    ids = {id(before)} | ({id(given)} if given is not None else set())
    old, new = _ops(before), _ops(after)
    links: Links = {}
    kept: set[str] = set()
    fresh: list[torch.fx.Node] = []
    for name, n in new.items():
        recorded = [x for x in _recorded(n, ids) if x in old]
        same = name in old and _same_op(old[name], n)
        if same and recorded in ([], [name]):
            kept.add(name)
            continue
        fresh.append(n)
        if recorded:
            links[name] = [(x, EXACT) for x in recorded]
        elif name in old:  # the same node given another op in place
            links[name] = [(name, EXACT)]
    gone = [name for name in old if name not in kept]
    users_of = {name: {u.name for u in old[name].users} for name in gone}
    inputs_of = {name: {a.name for a in old[name].all_input_nodes} for name in gone}
    for n in fresh:  # in graph order, so the new nodes a node reads are linked before it
        if n.name in links:
            continue
        users = {u.name for u in n.users} & kept
        reads = {a.name for a in n.all_input_nodes}
        # the removed nodes whose place it took (it feeds their users), and the removed nodes
        # that fed those and read what it reads (a fused chain), else those that read the same
        found = {g for g in gone if users_of[g] & users}
        grow = True
        while grow:
            more = {g for g in gone if g not in found and users_of[g] & found and inputs_of[g] & (reads | found)}
            found |= more
            grow = bool(more)
        found = found or {g for g in gone if inputs_of[g] & reads}
        ordered = [g for g in gone if g in found]
        if not ordered:  # built from other new nodes: it comes from where they come from
            ordered = list(dict.fromkeys(s for a in n.all_input_nodes for s, _ in links.get(a.name, ())))
        if ordered:
            links[n.name] = [(g, INFERRED) for g in ordered]
    return links, [n.name for n in fresh], gone


def fill_meta(after: torch.fx.Graph, before: torch.fx.Graph, links: Links) -> None:
    """Give each new node that lacks them the module path and source line of the node it comes from."""
    old = _ops(before)
    for n in after.nodes:
        if n.op not in _OPS:
            continue
        src = next((old[s] for s, _ in links.get(n.name, ()) if s in old), None)
        if src is not None:
            for key in ("nn_module_stack", "stack_trace", "torch_fn"):
                if key not in n.meta and key in src.meta:
                    n.meta[key] = src.meta[key]


def fill_values(graph: torch.fx.Graph) -> None:
    """Give each op node without a value (``meta["val"]``, which a pass building nodes by hand
    leaves out) one from running its op on fake tensors: the program's verifier wants it, and the
    stage's graph shows its shape."""
    fake_mode: Any = None
    for n in graph.nodes:
        if n.op != "call_function" or "val" in n.meta:
            continue
        if fake_mode is None:
            fake_mode = detect_fake_mode([m.meta.get("val") for m in graph.nodes if "val" in m.meta]) or False
        if fake_mode:
            n.meta["val"] = _fake_value(n, fake_mode)


def _fake_value(n: torch.fx.Node, fake_mode: Any) -> Any:
    args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: a.meta.get("val"))
    try:
        with fake_mode:
            return n.target(*args, **kwargs)  # type: ignore[operator]
    except Exception:  # an op fake tensors cannot run: its shape stays unknown
        return None


def ir_names(graph: torch.fx.Graph, ir: Graph) -> dict[str, str]:
    """fx op node name -> the IR node it became. The converter makes one IR op node per fx op node,
    in order, except a ``getitem`` on a multi-output op, which is a reference to that op's node."""
    ir_ops = [n for n in ir.nodes if n.kind == "op"]
    by_name = {n.name: n for n in ir_ops}
    out: dict[str, str] = {}
    it = iter(ir_ops)
    for n in graph.nodes:
        if n.op not in _OPS:
            continue
        src = n.args[0] if n.args else None
        if (n.target is operator.getitem and isinstance(src, torch.fx.Node) and src.name in out
                and isinstance(n.args[1], int) and len(by_name[out[src.name]].outputs) > 1):
            out[n.name] = out[src.name]
            continue
        node = next(it, None)
        if node is None:
            break
        out[n.name] = node.name
    return out


def rename(links: Links, new: dict[str, str], old: dict[str, str]) -> Links:
    """``links`` in IR names (``new`` for this stage's nodes, ``old`` for the stage before)."""
    out: Links = {}
    for name, srcs in links.items():
        key = new.get(name, name)
        merged = out.setdefault(key, [])
        for s, kind in srcs:
            item = (old.get(s, s), kind)
            if item not in merged:
                merged.append(item)
    return out


def names(items: Iterable[str], mapping: dict[str, str]) -> list[str]:
    return list(dict.fromkeys(mapping.get(x, x) for x in items))


__all__ = ["Links", "fill_meta", "fill_values", "ir_names", "link", "names", "rename"]
