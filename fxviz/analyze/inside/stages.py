"""Inductor's stages of one compiled graph as a pass pipeline, from torch's own graph payloads. No torch.

Each stage is a graph torch printed into its structured trace (``dynamo_output_graph``,
``after_pre_grad_graph``, ``aot_joint_graph``, ``aot_forward_graph``, ``aot_backward_graph``,
``aot_inference_graph``, ``inductor_post_grad_graph``), read by
:func:`fxviz.tracefile.fxtext.parse_graph`, and compared with the stage it comes from
(:attr:`~fxviz.analyze.pipeline.result.Stage.base`): a node of the same name and op is kept; a new
node is tied to the nodes torch says it comes from (``postToPre`` of Inductor's provenance
mappings: exact), else to the removed nodes of the stage before on its user source line
(inferred). A kept collective or wait that now stands elsewhere among the kept nodes is ``moved``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence

from fxviz.analyze.inside.comms import is_comm, moved
from fxviz.analyze.pipeline.result import EXACT, INFERRED, Stage
from fxviz.ir import Graph, Node

#: a primal's AOT descriptor: ``PlainAOTInput(idx=3)``, or an inner tensor of a tensor subclass
#: primal (a DTensor parameter, FSDP2's included), ``SubclassGetAttrAOTInput(base=PlainAOTInput(idx=3),
#: attr='_local_tensor')``; not a tangent, ``TangentAOTInput(output=PlainAOTOutput(idx=0))``
_PRIMAL = re.compile(r"^(?:SubclassGetAttrAOTInput\(base=)*\w*AOTInput\(idx=(\d+)\)")


def primal_index(desc: object) -> int | None:
    """The index, among the compiled graph's inputs (Dynamo's placeholders), of the primal AOT
    Autograd describes as ``desc`` (a placeholder's ``aot`` attribute); None for anything else."""
    m = _PRIMAL.match(str(desc or ""))
    return int(m.group(1)) if m else None


def op_nodes(graph: Graph) -> dict[str, Node]:
    return {n.name: n for n in graph.nodes if n.kind == "op"}


def _line(n: Node) -> tuple[str, int] | None:
    return (n.source.file, n.source.line) if n.source is not None and n.source.line else None


def make_stage(index: int, name: str, graph: Graph, base: Stage | None, *, seconds: float = 0.0,
               recorded: Mapping[str, Sequence[str]] | None = None, kind: str = "inductor") -> Stage:
    """Stage ``index``: ``graph`` against ``base`` (``None``: the first stage). ``recorded``: node
    -> the nodes of ``base`` torch says it comes from."""
    ops = op_nodes(graph)
    after = dict(Counter(n.target for n in ops.values()))
    if base is None:
        return Stage(index, name, graph, seconds, kind=kind, ops_after=after)
    old = op_nodes(base.graph)
    kept = {k for k, n in ops.items() if k in old and old[k].target == n.target}
    fresh = [k for k in ops if k not in kept]
    gone = [k for k in old if k not in kept]
    gone_set = set(gone)
    by_line: dict[tuple[str, int], list[str]] = {}
    for k in gone:
        at = _line(old[k])
        if at is not None:
            by_line.setdefault(at, []).append(k)
    links: dict[str, list[tuple[str, str]]] = {}
    for k in fresh:
        srcs = [s for s in (recorded or {}).get(k, ()) if s in old]
        if srcs:
            links[k] = [(s, EXACT) for s in dict.fromkeys(srcs)]
        elif k in old:
            links[k] = [(k, EXACT)]
        else:
            at = _line(ops[k])
            if at is not None and at in by_line:
                links[k] = [(s, INFERRED) for s in by_line[at]]
    replaced = [k for k in fresh if any(s in gone_set for s, _ in links.get(k, ()))]
    rset = set(replaced)
    place = {k: (i, i) for i, k in enumerate(k for k in old if k in kept)}
    shifted, notes = moved(place, [k for k in ops if k in kept], {k for k in kept if is_comm(ops[k].target)})
    return Stage(index, name, graph, seconds, kind=kind, ops_before=dict(base.ops_after), ops_after=after,
                 added=[k for k in fresh if k not in rset], removed=gone, replaced=replaced, links=links,
                 changed=bool(fresh or gone or shifted), base=None if base.index == index - 1 else base.index,
                 moved=shifted, notes=notes)


__all__ = ["make_stage", "op_nodes", "primal_index"]
