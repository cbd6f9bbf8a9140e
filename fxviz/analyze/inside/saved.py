"""Inside torch.compile from a saved ``TORCH_TRACE`` directory, with or without the model.

:func:`from_trace` reads the directory (:func:`fxviz.tracefile.read_trace`: every rank's file;
unreadable lines become notes) and builds each compiled graph's stages, kernels and costs. Given
the model and its inputs too, the model's eager graph is traced (no compile) and each Dynamo node
of the trace is matched to its eager op by the compile map's matching
(:func:`~fxviz.analyze.compilemap.match.pair`: op name and user source line, in order), so the
kernels are drawn on the model's module tree.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from fxviz.analyze.compilemap.match import pair
from fxviz.analyze.inside import overlay
from fxviz.analyze.inside.build import build
from fxviz.analyze.inside.result import Inside
from fxviz.ir import Graph
from fxviz.ops import op_name, property_target
from fxviz.tracefile import read_trace
from fxviz.tracefile.fxtext import parse_graph
from fxviz.tracefile.records import Trace


@dataclass
class _Op:
    """A Dynamo op as the trace prints it, for :func:`pair` (module unknown: matches any)."""

    name: str
    module: str
    file: str
    line: int
    node: str


def from_trace(path: str | os.PathLike[str] | Trace, eager: Graph | None = None) -> tuple[Inside, Trace]:
    """What ``path``'s structured trace (or a :class:`Trace` already read from it) records inside
    torch.compile; with ``eager`` (the model's eager graph), Dynamo's nodes matched to its ops and the
    overlays written on it."""
    trace = path if isinstance(path, Trace) else read_trace(path)
    eager_ops = dynamo_to_eager(trace, eager) if eager is not None else None
    inside = build(trace, eager_ops=eager_ops, eager=eager)
    if eager is not None:
        overlay.write(eager, inside)
    return inside, trace


def dynamo_to_eager(trace: Trace, eager: Graph) -> dict[str, dict[str, str]]:
    """Graph id -> Dynamo node -> eager op: each compile's Dynamo graph laid over the eager ops
    on its own (by op name and user line, in order)."""
    ops = eager.ops
    runs: list[tuple[str, Any]] = []
    k = 0
    for c in trace.compiles:
        art = c.first("dynamo_output_graph")
        if art is None:
            continue
        gid = f"g{k}"
        k += 1
        try:
            g = parse_graph(art.payload, name=gid) if isinstance(art.payload, str) else None
        except Exception:  # noqa: BLE001 - build() notes the graph it cannot read
            g = None
        if g is None:
            continue
        runs.append((gid, [_Op(_name(n), "", n.source.file if n.source else "",
                               n.source.line if n.source else 0, n.name) for n in g.nodes if n.kind == "op"]))
    out: dict[str, dict[str, str]] = {}
    for gid, dops in runs:  # each graph on its own: a recompile runs the same ops again
        row = pair(ops, [(gid, dops)])[0]
        out[gid] = {d.node: ops[i].name for d, i in zip(dops, row, strict=True) if i is not None}
    return out


def _name(n: Any) -> str:
    """The op's name as the eager tracer's is spelled: a tensor property the trace prints as an
    attribute read (``w.T``) is the tracer's ``Tensor.T.__get__``, ``T``."""
    attr = n.attrs.get("attr") if n.target == "builtins.getattr" else None
    return op_name(property_target(attr) if isinstance(attr, str) else n.target)


__all__ = ["dynamo_to_eager", "from_trace"]
