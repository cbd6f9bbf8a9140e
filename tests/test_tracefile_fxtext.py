"""fxviz.tracefile.fxtext.parse_graph on every graph payload of a real Inductor trace (no torch).

Oracles from torch's own records of the same compile (tests/data/traces/train.log): Dynamo's
``sizes`` in the ``dynamo_output_graph`` header, the post-grad node names of Inductor's
``postToPre``/``cppCodeToPost`` provenance, and the arguments the generated ``call()`` unpacks.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from fxviz.ir import SourceLoc, TensorMeta
from fxviz.tracefile import TraceFileError, read_trace
from fxviz.tracefile.fxtext import parse_graph

TRACE = Path(__file__).parent / "data" / "traces" / "train.log"
GRAPHS = ("dynamo_output_graph", "before_pre_grad_graph", "after_pre_grad_graph", "aot_joint_graph",
          "aot_forward_graph", "aot_backward_graph", "before_post_grad_graph",
          "inductor_post_grad_graph")
ASSIGN = re.compile(r'^\s+(\w+)(?:: "[^"]*")? = (.*)$')


@pytest.fixture(scope="module")
def trace():
    return read_trace(TRACE)


def payloads(trace):
    return [(c.compile_id, a) for c in trace.compiles for a in c.artifacts if a.name in GRAPHS]


def test_every_graph_payload_reads_one_node_per_statement(trace):
    seen = set()
    for _cid, a in payloads(trace):
        seen.add(a.name)
        g = parse_graph(a.payload, name=a.name)
        assert g.name == a.name and g.method == "tracefile"
        lines = a.payload.split("\n")
        assigned = [m for m in map(ASSIGN.match, lines) if m and "tree_flatten_spec" not in m[2]]
        aliases = [m for m in assigned if re.fullmatch(r"L_\w+", m[2])]
        ops = [n for n in g.nodes if n.kind in ("op", "constant")]
        placeholders = [n for n in g.nodes if n.kind in ("input", "parameter", "buffer")]
        assert [n.name for n in ops] == [m[1] for m in assigned if m not in aliases]
        assert g.nodes[-1].kind == "output" and len(g.nodes) == len(ops) + len(placeholders) + 1
        if aliases:  # Dynamo's graphs name their placeholders l_x_ = L_x_
            assert [n.name for n in placeholders] == [m[1] for m in aliases]
        # every input of every node is a node of the graph, read before it
        index = {n.name: i for i, n in enumerate(g.nodes)}
        for i, n in enumerate(g.nodes):
            assert all(index[r.node] < i for r in n.inputs), n.name
    assert seen == set(GRAPHS)


def test_dynamo_graph_sizes_sources_and_parameters(trace):
    for c in trace.compiles:
        a = c.first("dynamo_output_graph")
        g = parse_graph(a.payload, name=a.name)
        assert {n.name: list(n.meta.shape) for n in g.nodes if n.meta is not None} == a.meta["sizes"]
        x = g.node("l_x_")
        assert (x.kind, x.target, x.attrs["strides"]) == ("input", "L_x_", [[16, 1]])
        w = g.node("l_s_modules_ln_parameters_weight_")
        assert (w.kind, w.target, w.stack) == ("parameter", "ln.weight", (("ln", 0),))
        linear = g.node("linear")
        assert linear.target == "torch.nn.functional.linear"
        assert [r.node for r in linear.inputs] == ["l_x_", "l_s_modules_a_parameters_weight_",
                                                   "l_s_modules_a_parameters_bias_"]
        metrics = c.event("compilation_metrics")
        assert linear.source == SourceLoc(metrics["co_filename"], metrics["co_firstlineno"], "forward",
                                          "def forward(s,x): return s.b(torch.nn.functional.gelu("
                                          "s.ln(s.a(x))))")
        assert linear.outputs == (TensorMeta((32, 64), "float32", "cpu"),)
        assert [r.node for r in g.nodes[-1].inputs] == ["linear_1"]


def test_post_grad_graphs_meet_inductor_s_provenance(trace):
    for c in trace.compiles:
        graphs = c.all("inductor_post_grad_graph")
        mappings = c.all("inductor_provenance_tracking_node_mappings")
        codes = c.all("inductor_output_code")
        for a, m, code in zip(graphs, mappings, codes, strict=True):
            g = parse_graph(a.payload, name=a.name)
            ops = [n.name for n in g.nodes if n.kind == "op"]
            if "postToPre" in m.payload:  # the forward: torch 2.13 leaves the backward's empty
                assert ops == list(m.payload["postToPre"])
                covered = {x for nodes in m.payload["cppCodeToPost"].values() for x in nodes}
                assert covered <= set(ops)
            # the compiled call() unpacks exactly the graph's placeholders, in order
            unpack = re.search(r"^\s+(.*?),? = args$", code.payload, re.MULTILINE)
            assert unpack is not None
            assert [n.name for n in g.inputs] == [x.strip() for x in unpack[1].split(",")]


def test_the_joint_graph_declares_placeholders_and_reads_var_mean(trace):
    g = parse_graph(trace.compiles[1].first("aot_joint_graph").payload, name="joint")
    assert [n.name for n in g.inputs][-1] == "tangents_1"
    assert "primals" not in g and "tangents" not in g
    assert g.node("tangents_1").attrs["aot"] == "TangentAOTInput(output=PlainAOTOutput(idx=0))"
    var_mean = g.node("var_mean")
    assert var_mean.target == "aten.var_mean.correction"
    assert var_mean.outputs == (TensorMeta((32, 1), "float32", "cpu"),) * 2
    getitem_1 = g.node("getitem_1")
    assert (getitem_1.target, getitem_1.inputs[0].node, getitem_1.inputs[0].index) == (
        "operator.getitem", "var_mean", 1)
    assert g.node("addmm").attrs["args"] == "primals_2, primals_3, permute"


SYNTHETIC = '''class GraphModule(torch.nn.Module):
    def forward(self, s0: "Sym(s0)", L_x_: "f32[s0, 4][4, 1]cuda:0", L_y_: "bf16[2*s0][1]cpu"):
        l_x_ = L_x_
        l_y_ = L_y_

        # File: /m.py:3 in forward, code: return x + 1
        add: "f32[s0, 4][4, 1]cuda:0" = l_x_ + 1
        neg: "f32[s0, 4][4, 1]cuda:0" = -add
        size = l_x_.size()
        getitem: "Sym(s0)" = size[0];  size = None
        shape = l_x_.shape
        view: "f32[4, s0][1, 4]cuda:0" = neg.view(4, getitem);  neg = getitem = None
        # No stacktrace found for following nodes
        swish: "f32[s0, 4][4, 1]cuda:0" = torch.ops.mylib.scaled_swish.default(add, 'mode,x');  add = None
        submod_0 = self.submod_0(swish, l_y_)
        return (view, submod_0)

    class submod_0(torch.nn.Module):
        def forward(self, a: "f32[s0, 4][4, 1]cuda:0", b):
            relu: "f32[s0, 4][4, 1]cuda:0" = torch.relu(a);  a = None
            return relu
'''


def test_symbolic_sizes_operators_methods_custom_ops_and_submodules():
    g = parse_graph(SYNTHETIC, name="g")
    assert [n.name for n in g.inputs] == ["s0", "l_x_", "l_y_"]
    assert g.node("s0").meta == TensorMeta((), "int", "", "s0")
    assert g.node("l_x_").meta == TensorMeta(("s0", 4), "float32", "cuda:0")
    assert g.node("l_y_").meta == TensorMeta(("2*s0",), "bfloat16", "cpu")
    targets = {n.name: n.target for n in g.nodes}
    assert targets == {"s0": "s0", "l_x_": "L_x_", "l_y_": "L_y_", "add": "operator.add",
                       "neg": "operator.neg", "size": "Tensor.size", "getitem": "operator.getitem",
                       "shape": "builtins.getattr", "view": "Tensor.view",
                       "swish": "mylib::scaled_swish.default", "submod_0": "self.submod_0",
                       "output": ""}
    assert [r.node for r in g.node("view").inputs] == ["neg", "getitem"]
    assert [r.node for r in g.node("swish").inputs] == ["add"]  # 'mode,x' is a string
    assert g.node("add").source == SourceLoc("/m.py", 3, "forward", "return x + 1")
    assert g.node("swish").source is None
    assert [r.node for r in g.nodes[-1].inputs] == ["view", "submod_0"]
    sub = g.annotations["subgraphs"]["submod_0"]
    assert [n["name"] for n in sub["nodes"]] == ["a", "b", "relu", "output"]
    assert g.notes == ["1 nested graph(s) (higher-order op bodies or submodules) in "
                       "annotations['subgraphs']: submod_0"]


def test_inference_graphs_and_subscripts_with_slices_read():
    """torch 2.13 prints an inference graph's class as ``<lambda>``, and GPT-2's Dynamo graph
    indexes with a tuple of slices: both were unreadable."""
    text = (
        "class <lambda>(torch.nn.Module):\n"
        '    def forward(self, arg0_1: "f32[1, 7, 32][224, 32, 1]cpu"):\n'
        '        h: "f32[1, 7, 32][224, 32, 1]cpu" = arg0_1[(slice(None, None, None), slice(0, None, None), Ellipsis)]\n'
        '        relu: "f32[1, 7, 32][224, 32, 1]cpu" = torch.ops.aten.relu.default(h);  h = None\n'
        "        return (relu,)\n"
    )
    g = parse_graph(text, name="g")
    h = g.node("h")
    assert h.target == "operator.getitem" and [r.node for r in h.inputs] == ["arg0_1"]
    assert h.attrs["args"] == "(slice(None, None, None), slice(0, None, None), Ellipsis)"
    assert h.meta == TensorMeta((1, 7, 32), "float32", "cpu")
    assert [r.node for r in g.node("relu").inputs] == ["h"]


@pytest.mark.parametrize(("text", "where"), [
    ("class G(torch.nn.Module):\n    def forward(self, x):\n        y = x +* 2\n        return y\n",
     "line 3"),
    ("class G(torch.nn.Module):\n    def forward(self, x):\n        y: \"f32[3\" = x.relu()\n", "line 3"),
    ("hello\n", "line 1"),
    ("class G(torch.nn.Module):\n    def forward(self, x):\n        for i in x:\n", "line 3"),
])
def test_unreadable_text_names_the_line(text, where):
    with pytest.raises(TraceFileError, match=f"^g: {where}: "):
        parse_graph(text, name="g")


def test_fxtext_imports_no_torch():
    code = ("import sys, fxviz.tracefile.fxtext; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
