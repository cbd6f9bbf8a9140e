"""From the errors of each op to what a reader wants: the error of each module call's output and
where the error is born (the first divergence). No torch."""

from __future__ import annotations

from fxviz.analyze.numerics.result import Error
from fxviz.ir import Graph
from fxviz.ops import op_family


def module_errors(graph: Graph, errors: dict[str, list[Error]]) -> dict[str, Error]:
    """Call id -> the worst :class:`Error` among the values the call hands out (its outputs);
    the model's own call is ``""``."""
    out: dict[str, Error] = {}
    for c in graph.calls.walk():
        found = []
        refs = c.outputs if c.stack else [r for n in graph.nodes if n.kind == "output" for r in n.inputs[:1]]
        for r in refs:
            errs = errors.get(r.node)
            if errs:
                found.append(errs[min(r.index, len(errs) - 1)])
        worst = Error.worst(found)
        if worst is not None:
            out[c.id] = worst
    return out


def births(graph: Graph, errors: dict[str, Error]) -> list[str]:
    """Nodes, in execution order, whose value is beyond tolerance while every value they read is
    within: where an error is born rather than carried. A value not compared (no counterpart) is
    within unless something it reads is not; a random op's value is taken from eager, so it is.
    A view beyond tolerance with inputs within names the op that made its input."""
    tainted: set[str] = set()
    born: list[str] = []
    for n in graph.nodes:
        if n.kind != "op":
            continue
        e = errors.get(n.name)
        upstream = any(r.node in tainted for r in n.inputs)
        if e is not None and not e.comparable:
            continue
        if e is not None and e.exceeds:
            tainted.add(n.name)
            if upstream:
                continue
            # a view or split computes nothing: part of its input is beyond tolerance though the
            # whole is within (the q of a fused qkv); the error is born at the op that made it, where
            # that op was compared (under Inductor only values crossing a graph's boundary are)
            maker = _maker(graph, n.name)
            born.append(maker if maker in errors else n.name)
        elif upstream and e is None:
            tainted.add(n.name)
    return list(dict.fromkeys(born))


def _maker(graph: Graph, name: str) -> str:
    """``name``, or for a view (of a view ...) the op that made the value it views."""
    seen = 0
    n = graph.node(name)
    while op_family(n.target) == "shape" and seen < 1000:
        made = next((graph.node(r.node) for r in n.inputs if graph.node(r.node).kind == "op"), None)
        if made is None:
            break
        n, seen = made, seen + 1
    return n.name


__all__ = ["births", "module_errors"]
