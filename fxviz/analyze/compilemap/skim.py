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

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from fxviz.analyze.compilemap.record import Recorder, op_nodes
from fxviz.analyze.compilemap.state import ModelSnapshot
from fxviz.fallback.shapes_only import ShapesOnly
from fxviz.fallback.trace import trace_eager, uses_meta
from fxviz.ir import Graph

#: What one multiply-accumulate of a convolution or a matrix product costs on a CPU core: about
#: 50 ps (ResNet-18's 1.8 G in 0.09 s).
MAC_S = 5e-11
#: What tracing one op under ShapesOnly adds (each of its ATen ops calls into the Python dispatch
#: mode): about 20 us on a CPU core (the 300-layer MLP's 900 ops: 0.03 s).
SKIM_OP_S = 2e-5
#: A convolution's output size comes from torch's meta kernel, in Python: about 1 ms.
SKIM_CONV_S = 1e-3
#: Ops (as :func:`fxviz.ops.op_name` names them) whose arithmetic ShapesOnly skips, and where their
#: reduction length is: the weight's fan-in (convolution, ``linear``) or the first operand's last
#: dimension (the products; ``addmm``'s second argument).
_WEIGHTED = ("linear",)
_PRODUCTS = {"matmul": 0, "mm": 0, "bmm": 0, "addmm": 1}


def skim_cost(names: Iterable[str]) -> float:
    """About what skimming adds to a trace of these ops (op names, as :func:`fxviz.ops.op_name`
    spells them), in seconds."""
    return sum(SKIM_CONV_S if n.startswith("conv") else SKIM_OP_S for n in names)


def _value(a: Any) -> Any:
    return a.meta.get("example_value") if isinstance(a, torch.fx.Node) else None


def _numel(shape: Any) -> int:
    return math.prod(s for s in shape if isinstance(s, int)) if all(isinstance(s, int) for s in shape) else 0


def macs(name: str, node: torch.fx.Node) -> int:
    """The multiply-accumulates of one op of a Dynamo graph (0 for ops ShapesOnly does not skim, or
    sizes that are symbols)."""
    out = _value(node)
    if not isinstance(out, torch.Tensor):
        return 0
    args = node.args
    if name.startswith("conv") and len(args) > 1:  # weight (out, in / groups, *kernel): fan-in per output
        w = _value(args[1])
        if isinstance(w, torch.Tensor) and w.dim() > 1 and isinstance(w.shape[0], int) and w.shape[0]:
            return _numel(out.shape) * _numel(w.shape) // w.shape[0]
        return 0
    k = 1 if name in _WEIGHTED else _PRODUCTS.get(name)
    a = _value(args[k]) if k is not None and len(args) > k else None
    if not isinstance(a, torch.Tensor) or a.dim() == 0 or not isinstance(a.shape[-1], int):
        return 0
    return _numel(out.shape) * a.shape[-1]


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


def eager_graph(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], grad: bool, state: ModelSnapshot,
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
