"""Each module call's ``nodes`` (every op inside it, any depth, in execution order), worked out for
the whole call tree (:mod:`fxviz.calls`) on the first read of :attr:`fxviz.calls.Call.nodes`: the
passes of a capture never read them (``fold`` reads the ops of a few calls' subtrees), and filling
them was a third of building the tree. No torch, no import of the IR or of the calls at run time."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, pairwise
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fxviz.calls import Call
    from fxviz.ir import Node


class NodesFill:
    """The nodes of every call of one tree, filled in on first use."""

    __slots__ = ("args",)

    def __init__(self, root: Call, nodes: Sequence[Node]) -> None:
        self.args: tuple[Call, Sequence[Node]] | None = (root, nodes)

    def fill(self) -> None:
        if self.args is None:
            return
        root, nodes = self.args
        self.args = None
        # each op's position in the graph's nodes (the last of a name, as the tree's walk noted it)
        fill_nodes(root, {n.name: i for i, n in enumerate(nodes) if n.kind == "op"})


def fill_nodes(root: Call, at: dict[str, int]) -> None:
    """Each call's ``nodes``, its children's before it: its own ops and its children's ``nodes``,
    joined as blocks where they ran one after the other (the usual case: read in ``steps`` order,
    no sort), merged by position where they interleave. Appending every op to each call around it
    cost the depth of the op in Python; sorting each call's blocks, a third of the call tree.
    ``at``: each op's position in the graph's nodes."""
    for c in reversed(root.listed()):
        if not c.children:  # a leaf call: its own ops, already in order
            c._nodes = list(c.ops)
            continue
        if not c.regions:  # steps: own ops and child calls by first op; joined unless one overlaps the next
            out: list[str] = []
            last = -1
            for s in c.steps:
                if isinstance(s, str):
                    if (p := at[s]) < last:
                        break
                    out.append(s)
                    last = p
                elif block := s._nodes:  # type: ignore[union-attr]  # a child call (no regions here)
                    if at[block[0]] < last:
                        break
                    out += block
                    last = at[block[-1]]
            else:
                c._nodes = out
                continue
        blocks = [[op] for op in c.ops] if c.ops else []
        blocks += [nodes for ch in c.children if (nodes := ch._nodes)]
        if len(blocks) > 1:
            blocks.sort(key=lambda b: at[b[0]])
            if any(at[b[-1]] > at[nb[0]] for b, nb in pairwise(blocks)):
                c._nodes = sorted(chain.from_iterable(blocks), key=at.__getitem__)
                continue
        c._nodes = list(chain.from_iterable(blocks))  # in C: the depth of the ops, times a copy


__all__ = ["NodesFill", "fill_nodes"]
