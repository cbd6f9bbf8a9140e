"""parse_graph against the fx graphs torch itself hands to the backend, in the same run.

A small model with dynamic shapes, a ``torch.cond``, a multi-output op, a method call and Python
operators on sizes is compiled with a backend that keeps the GraphModules Dynamo and AOT Autograd
make (forward and backward), while :func:`structured_trace` collects the trace. Every graph payload
of the trace is parsed and compared node by node with the GraphModule it prints: names, kinds,
targets (spelled as fxviz's converter spells them), inputs, shapes and dtypes.
"""

from __future__ import annotations

import operator

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from fxviz.symbolic.convert import target_name
from fxviz.torchbridge.tracelog import structured_trace
from fxviz.tracefile import read_events
from fxviz.tracefile.fxtext import parse_graph


class Branchy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.ln = torch.nn.LayerNorm(16)

    def forward(self, x):
        h = self.ln(self.a(x))
        n = x.shape[0] * 2
        h = h.view(-1, 8) if n > 0 else h
        return torch.cond(h.sum() > 0, lambda t: t.relu(), lambda t: t - 1, (h,))


def fx_target(n: torch.fx.Node) -> str:
    if n.op == "call_function" and n.target is operator.getitem:
        return "operator.getitem"
    if n.op == "call_function" and getattr(n.target, "__module__", "") in ("_operator", "operator"):
        return f"operator.{n.target.__name__}"
    return target_name(n)


def value_of(n: torch.fx.Node) -> tuple | None:
    val = n.meta.get("val", n.meta.get("example_value"))
    if isinstance(val, torch.Tensor):
        return ([str(d) for d in val.shape], str(val.dtype).removeprefix("torch."), str(val.device))
    if isinstance(val, torch.SymInt):
        return (str(val),)
    return None


def snapshot(gm: torch.fx.GraphModule) -> dict:
    """What the backend was handed, as plain data, at once (AOT Autograd consumes the graph)."""
    return {
        "nodes": [(n.name, n.op, "" if n.op in ("placeholder", "output") else
                   str(n.target) if n.op == "get_attr" else fx_target(n),
                   [a.name for a in n.all_input_nodes], value_of(n)) for n in gm.graph.nodes],
        "subgraphs": {name: [n.name for n in sub.graph.nodes]
                      for name, sub in gm.named_children() if isinstance(sub, torch.fx.GraphModule)},
    }


@pytest.fixture(scope="module")
def run():
    graphs: dict[str, list[dict]] = {"dynamo": [], "fw": [], "bw": []}

    def keep(kind):
        def compiler(gm, example_inputs):
            graphs[kind].append(snapshot(gm))
            return make_boxed_func(gm.forward)
        return compiler

    aot = aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw"))

    def backend(gm, example_inputs):
        graphs["dynamo"].append(snapshot(gm))
        return aot(gm, example_inputs)

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Branchy()
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with structured_trace(provenance=False) as events:
        compiled(torch.randn(6, 8)).sum().backward()
    torch._dynamo.reset()
    return read_events(list(events)), graphs


def check_same(parsed, snap: dict) -> None:
    """The parsed graph is the backend's graph: node by node."""
    fx_nodes = snap["nodes"]
    placeholders = [n for n in fx_nodes if n[1] == "placeholder"]
    body = [n for n in fx_nodes if n[1] not in ("placeholder", "output")]
    ours = {n.name: n for n in parsed.nodes}
    assert [n.name for n in parsed.nodes if n.kind in ("input", "parameter", "buffer")] == [
        n[0] for n in placeholders]
    assert [n.name for n in parsed.nodes if n.kind in ("op", "constant")] == [n[0] for n in body]
    for name, op, target, inputs, _ in body:
        mine = ours[name]
        if op == "get_attr":
            assert (mine.kind, mine.target) == ("constant", target)
            continue
        assert mine.target == target, name
        assert sorted({r.node for r in mine.inputs}) == sorted(set(inputs)), name
    for name, _op, _t, _i, value in placeholders + body:
        meta = ours[name].meta
        if value is not None and len(value) == 3:
            assert meta is not None, name
            assert ([str(d) for d in meta.shape], meta.dtype, meta.device) == value, name
        elif value is not None:
            assert meta is not None and meta.value == value[0], name
    out = fx_nodes[-1]
    assert out[1] == "output"
    assert [r.node for r in parsed.nodes[-1].inputs] == out[3]


def test_every_graph_payload_is_torch_s_graph(run):
    trace, graphs = run
    assert trace.problems == []
    # Dynamo restarts the frame once (LayerNorm's eps) after the backend compiled the first attempt
    assert [c.compile_id for c in trace.compiles] == ["0/0", "0/0_1"]
    # each graph torch printed is the one the backend got, in order
    printed = {name: [a for c in trace.compiles for a in c.all(name)]
               for name in ("dynamo_output_graph", "aot_forward_graph", "aot_backward_graph")}
    for name, kind in [("dynamo_output_graph", "dynamo"), ("aot_forward_graph", "fw"),
                       ("aot_backward_graph", "bw")]:
        assert len(printed[name]) == len(graphs[kind]) >= 1, name
        for artifact, gm in zip(printed[name], graphs[kind], strict=True):
            check_same(parse_graph(artifact.payload, name=name), gm)
    c = trace.compiles[-1]
    dynamo = parse_graph(c.first("dynamo_output_graph").payload, name="dynamo_output_graph")
    assert dynamo.annotations["subgraphs"].keys() == {"cond_true_0", "cond_false_0"}
    assert "2 nested graph(s)" in dynamo.notes[0]
    cond = next(n for n in dynamo.nodes if n.target == "higher_order.cond")
    assert {r.node for r in cond.inputs} >= {"cond_true_0", "cond_false_0"}
    # the bodies of the cond, read into the annotations, are the GraphModule's submodules
    for branch in ("cond_true_0", "cond_false_0"):
        nodes = dynamo.annotations["subgraphs"][branch]["nodes"]
        assert [n["name"] for n in nodes] == graphs["dynamo"][-1]["subgraphs"][branch]
    # dynamo's sizes: symbolic where torch made them so
    sizes = c.first("dynamo_output_graph").meta["sizes"]
    multi = {r.node for n in dynamo.nodes if n.target == "operator.getitem" for r in n.inputs}
    assert {n.name: [str(d) for d in n.meta.shape] for n in dynamo.nodes
            if n.meta is not None and n.meta.is_tensor and n.name not in multi} == {
        k: [str(d) for d in v] for k, v in sizes.items()}
    assert any(isinstance(d, str) for n in dynamo.nodes if n.meta is not None
               for d in n.meta.shape)
