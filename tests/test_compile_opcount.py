"""A compiled graph's op count against torch's records of the same graph. ``torch._dynamo.explain``'s
``op_count`` counts only the ``call_function`` nodes of Dynamo's graphs; a method call on a tensor
(``y.unflatten(...)``, ``y.relu()``) is a ``call_method`` node and a module Dynamo keeps whole a
``call_module`` node, which it leaves out. The map's count is every call node, as torch's
compilation metrics (``graph_op_count``) and ``counters['stats']['calls_captured']`` count them."""

from __future__ import annotations

import torch
import torch._dynamo as dynamo
from torch import nn
from torch._dynamo.utils import clear_compilation_metrics, counters, get_compilation_metrics

from fxviz.analyze.compilemap import compile_map


class Unflattens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.unflat = nn.Unflatten(1, (2, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.unflat(self.lin(x)).unflatten(2, (2, 2)).relu()


def test_a_graphs_op_count_is_torchs_call_count_and_explain_counts_function_calls_only() -> None:
    model, x = Unflattens().eval(), torch.randn(3, 8)
    cmap = compile_map(model, (x,), backend="eager")
    (g,) = cmap.graphs

    gms: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: object) -> torch.fx.GraphModule:
        gms.append(gm)
        return gm

    dynamo.reset()
    clear_compilation_metrics()
    counters.clear()
    with torch.no_grad():
        torch.compile(model, backend=keep)(x)
    (metrics,) = get_compilation_metrics()
    (gm,) = gms
    kinds = [n.op for n in gm.graph.nodes if n.op.startswith("call_")]
    assert kinds == ["call_function", "call_method", "call_method", "call_method"]  # linear; unflatten x2, relu
    assert g.ops == metrics.graph_op_count == counters["stats"]["calls_captured"] == len(kinds) == 4
    dynamo.reset()
    with torch.no_grad():
        explained = dynamo.explain(model)(x)
    dynamo.reset()
    assert explained.op_count == kinds.count("call_function") == 1
    # every eager op ran in that graph: nn.Unflatten's and the method's unflatten, linear, relu
    assert cmap.assigned == {"linear": "g0", "unflatten": "g0", "unflatten_1": "g0", "relu": "g0"}
