"""The compile map's eager graph without the forward's heavy arithmetic, where that is right and
worth it. Needs torch.

The eager graph of the first input set is a second run of the forward after the compiled one. Where
Dynamo broke no graph, the forward's ops depend on no tensor's values (a value read in Python,
``.item()``, ``if tensor:``, breaks the graph), so its convolutions and matrix products need not
compute: :class:`~fxviz.fallback.shapes_only.ShapesOnly` answers them with zeros of the right size
and strides, and the trace records the same ops, names, lines and shapes. That skims ResNet-18's
trace from 0.11 s to 0.04 s of CPU time and GPT-2 small's from 0.70 s to 0.13 s; a 300-layer MLP
of 8x64 products, whose arithmetic is nothing, goes from 0.06 s to 0.09 s (the dispatch mode's cost
per op). So :class:`Arithmetic` counts the multiply-accumulates of the convolutions and matrix
products of the graphs Dynamo compiled, at the sizes it traced them with, and :func:`eager_graph`
skims only where they cost more than skimming adds (:func:`skim_cost`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from fxviz.analyze.compilemap.record import Recorder, op_nodes
from fxviz.analyze.flops import op_flops
from fxviz.fallback.shapes_only import ShapesOnly
from fxviz.fallback.trace import trace_eager, uses_meta
from fxviz.ir import Graph
from fxviz.torchbridge.guard import ModelState

#: What one multiply-accumulate of a convolution or a matrix product costs on a CPU core: about
#: 50 ps (ResNet-18's 1.8 G in 0.09 s).
MAC_S = 5e-11
#: What tracing one op under ShapesOnly adds (each of its ATen ops calls into the Python dispatch
#: mode): about 20 us on a CPU core (the 300-layer MLP's 900 ops: 0.03 s).
SKIM_OP_S = 2e-5
#: A convolution's output size comes from torch's meta kernel, in Python: about 1 ms.
SKIM_CONV_S = 1e-3
#: Ops (as :func:`fxviz.ops.op_name` names them) whose arithmetic ShapesOnly skips, apart from the
#: convolutions (``conv...``): Dynamo's graphs call the torch functions, the ATen ops below them are
#: the ones skipped.
_SKIMMED = frozenset({"linear", "matmul", "mm", "bmm", "addmm"})


def skim_cost(names: Iterable[str]) -> float:
    """About what skimming adds to a trace of these ops (op names, as :func:`fxviz.ops.op_name`
    spells them), in seconds."""
    return sum(SKIM_CONV_S if n.startswith("conv") else SKIM_OP_S for n in names)


def macs(name: str, node: torch.fx.Node) -> int:
    """The multiply-accumulates of one op of a Dynamo graph, half the FLOPs torch's formulas count
    at its traced sizes (:func:`fxviz.analyze.flops.op_flops`); 0 for ops ShapesOnly does not skim,
    or sizes that are symbols."""
    if not (name.startswith("conv") or name in _SKIMMED):
        return 0
    out = node.meta.get("example_value")
    if not isinstance(out, torch.Tensor):
        return 0
    inputs = (a.meta.get("example_value") for a in tree_leaves((node.args, node.kwargs)) if isinstance(a, torch.fx.Node))
    shapes = [tuple(v.shape) for v in inputs if isinstance(v, torch.Tensor)]  # as the capture's node inputs
    if not all(isinstance(d, int) for s in (*shapes, out.shape) for d in s):
        return 0
    return (op_flops(name, shapes, tuple(out.shape)) or 0) // 2


class Arithmetic:
    """The multiply-accumulates of the graphs ``recorder`` compiles (its real backend wrapped):
    ``macs[i]`` is ``rec.graphs[i]``'s, one run's."""

    def __init__(self, recorder: Recorder) -> None:
        self.rec = recorder.rec
        self.macs: dict[int, int] = {}
        real = recorder.real

        def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
            g = self.rec.graphs[-1]  # the recorder appends the graph before it calls the backend
            self.macs[len(self.rec.graphs) - 1] = sum(macs(o.name, n) for o, n in zip(g.ops, op_nodes(gm), strict=False))
            return real(gm, example_inputs)

        recorder.real = backend

    def worth_skimming(self) -> bool:
        """Whether the first input set's convolutions and products, in every run of their graphs,
        cost more than skimming adds to the trace of its ops."""
        ran = [g for g, k in self.rec.runs if k == 0 and self.rec.forward(g)]
        saved = MAC_S * sum(self.macs.get(g, 0) for g in ran)
        return saved > skim_cost(o.name for g in ran for o in self.rec.graphs[g].ops)


def eager_graph(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], grad: bool, state: ModelState,
                *, skim: bool) -> Graph:
    """The eager graph of the first input set, skimmed (``skim``: Dynamo broke no graph and
    :meth:`Arithmetic.worth_skimming`). Should the skimmed run still read a value (one Dynamo was
    told to capture, ``capture_scalar_outputs``) or fail, or where it may not skim, the real
    forward is traced."""
    if skim and not uses_meta(model, args, kwargs):
        mode = ShapesOnly()
        try:
            graph = trace_eager(model, args, kwargs, level="function", grad=grad, watch=lambda _: mode)
        except Exception:  # noqa: BLE001 - the real forward says what is wrong, if anything
            graph = None
        if graph is not None and mode.read is None:
            return graph
        state.restore()
    return trace_eager(model, args, kwargs, level="function", grad=grad)


__all__ = ["MAC_S", "Arithmetic", "eager_graph", "macs", "skim_cost"]
