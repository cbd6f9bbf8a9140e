"""A tensor property read in the forward (``input @ self.weight.T``, as Falcon's ``FalconLinear``
does) is one op in both runs: the eager tracer records ``Tensor.T.__get__`` and Dynamo's graph a
``getattr(weight, 'T')`` call node at the same user line. They are one op: the map must pair them,
not list Dynamo's as an op "no eager op is" with a note that the forward took another path when
compiling (it did not: the compiled graph below holds the same ops at the same lines)."""

from __future__ import annotations

import builtins

import torch
import torch._dynamo as dynamo
from torch import nn

from fxviz.analyze.compilemap import compile_map


class TransposedLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.weight.T).mT.relu()


def test_a_tensor_property_is_the_eager_op_at_its_line_not_an_op_only_compiled() -> None:
    torch.manual_seed(0)
    model, x = TransposedLinear().eval(), torch.randn(3, 4)
    cmap = compile_map(model, (x,), backend="eager")

    gms: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: object) -> torch.fx.GraphModule:
        gms.append(gm)
        return gm

    dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=keep)(x)
    dynamo.reset()
    (gm,) = gms
    calls = [n for n in gm.graph.nodes if n.op.startswith("call_")]
    props = [n.args[1] for n in calls if n.target is builtins.getattr]
    assert props == ["T", "mT"]  # torch's graph: the two property reads are call nodes
    (g,) = cmap.graphs
    assert g.ops == len(calls) == 4
    # the eager forward ran the same four ops, and each is one of them
    assert g.eager_ops == 4 and g.no_eager_op == []
    assert sorted(cmap.assigned) == ["T", "mT", "matmul", "relu"] and set(cmap.assigned.values()) == {"g0"}
    assert not any("match no op of the eager forward" in n for n in cmap.notes)


def test_a_saved_traces_property_read_is_paired_with_the_eager_op_too() -> None:
    """``--from-trace``: the trace prints the property read as ``weight.T``; it is the eager ``T``."""
    from fxviz import capture
    from fxviz.analyze.inside.saved import dynamo_to_eager
    from fxviz.torchbridge.tracelog import structured_trace
    from fxviz.tracefile import read_events

    torch.manual_seed(0)
    model, x = TransposedLinear().eval(), torch.randn(3, 4)
    dynamo.reset()
    with structured_trace(provenance=False) as events, torch.no_grad():
        torch.compile(model, backend="eager")(x)
    dynamo.reset()
    eager = capture(model, (x,), method="eager")
    ops = {n.name for n in eager.ops}
    assert {"T", "mT", "matmul", "relu"} <= ops
    (paired,) = dynamo_to_eager(read_events(list(events)), eager).values()
    assert sorted(paired.values()) == ["T", "mT", "matmul", "relu"]  # each of Dynamo's 4 ops is one eager op
