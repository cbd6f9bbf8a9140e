"""The values at the boundary of each module call and region of a call tree (:mod:`fxviz.calls`):
what it reads from outside and what it makes that is read outside. Worked out from the data edges,
for the whole tree at once, on the first read of :attr:`fxviz.calls.Call.inputs` or ``outputs``:
most readers of a tree never ask. No torch, no import of the IR or of the calls at run time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fxviz.calls import Call, Region
    from fxviz.ir import Node, Ref

#: Node kinds that hold state of the model rather than computing something.
STATE_KINDS = frozenset({"parameter", "buffer", "constant"})


class Boundaries:
    """The inputs and outputs of every call, filled in on first use."""

    __slots__ = ("args",)

    def __init__(self, nodes: Sequence[Node], node_call: dict[str, Call], root: Call) -> None:
        self.args: tuple[Sequence[Node], dict[str, Call], Call] | None = (nodes, node_call, root)

    def fill(self) -> None:
        if self.args is None:
            return
        nodes, node_call, root = self.args
        self.args = None
        for c in root.walk():
            c._pending = None
        _boundaries(nodes, node_call, root, _positions(nodes))


def _positions(nodes: Sequence[Node]) -> dict[str, int]:
    """Node name -> its place in ``nodes`` (the last of a name): what orders a call's outputs."""
    return {n.name: i for i, n in enumerate(nodes)}


def _boundaries(nodes: Sequence[Node], node_call: dict[str, Call], root: Call, position: dict[str, int]) -> None:
    """Fill each call's inputs and outputs from the data edges: an edge from a value made in call
    P to a node in call C crosses every call below their common ancestor, out of P's side and into
    C's side. Cost per edge: the nesting levels it crosses. Only the forward's edges: a call of a
    training step reads and makes what its forward does (its backward ops' gradients are theirs)."""
    kinds = {n.name: n.kind if n.phase == "forward" else "" for n in nodes}
    ins: dict[int, dict[Ref, None]] = {}
    outs: dict[int, dict[Ref, None]] = {}
    calls: dict[int, Call] = {}
    for n in nodes:
        if n.kind in STATE_KINDS or not n.inputs or n.phase != "forward":
            continue
        dst = node_call.get(n.name, root)
        for r in n.inputs:
            k = kinds.get(r.node)
            if k in STATE_KINDS or k == "":
                continue
            src = node_call.get(r.node, root)
            a, b = src, dst
            while a is not b:
                if a.depth >= b.depth and a.parent is not None:
                    outs.setdefault(id(a), {})[r] = None
                    calls[id(a)] = a
                    a = a.parent
                elif b.parent is not None:
                    ins.setdefault(id(b), {})[r] = None
                    calls[id(b)] = b
                    b = b.parent
                else:  # pragma: no cover - both at the root
                    break
    for key, refs in ins.items():
        calls[key]._inputs = list(refs)
    for key, refs in outs.items():
        calls[key]._outputs = sorted(refs, key=lambda r: (-position.get(r.node, 0), r.index))


class RegionBoundaries:
    """The inputs and outputs of regions, worked out per region on first use from its ops and
    the readers of every value (built once, for the first region asked)."""

    __slots__ = ("by_name", "nodes", "position", "readers")

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = nodes
        self.position: dict[str, int] = {}
        self.by_name: dict[str, Node] | None = None
        self.readers: dict[str, list[str]] | None = None

    def of(self, region: Region) -> tuple[list[Ref], list[Ref]]:
        if self.by_name is None or self.readers is None:
            self.by_name = {n.name: n for n in self.nodes}
            self.position = _positions(self.nodes)
            self.readers = {}
            for n in self.nodes:
                for r in n.inputs:
                    self.readers.setdefault(r.node, []).append(n.name)
        by_name, readers = self.by_name, self.readers
        inside = set(region.nodes)
        ins: dict[Ref, None] = {}
        outs: dict[Ref, None] = {}
        for name in region.nodes:
            node = by_name[name]
            for r in node.inputs:
                src = by_name.get(r.node)
                if r.node not in inside and src is not None and src.kind not in STATE_KINDS:
                    ins[r] = None
        for name in region.nodes:
            for u in readers.get(name, ()):
                if u not in inside:
                    outs.update((r, None) for r in by_name[u].inputs if r.node == name)
        return list(ins), sorted(outs, key=lambda r: (-self.position.get(r.node, 0), r.index))


__all__ = ["STATE_KINDS", "Boundaries", "RegionBoundaries"]
