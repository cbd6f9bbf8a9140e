"""Issue 19, points 1, 4 and 6 on the Python side: a tied weight is one node, read from its owner
and named as shared by the module that holds it under a second name; a box counts the ops of its
own call; the report's words (capture method, torch call, counts, the divergence's node) say what
is drawn. Facts are checked against torch's own record of the model and the run."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode, resolve_name

import fxviz
from fxviz import examples
from fxviz.ir import Node, Ref, TensorMeta
from fxviz.render.html import view_model
from fxviz.render.view import captured_by, counted, module_boxes, node_origin
from fxviz.torchbridge.values import mark_tied


class Tied(nn.Module):
    """An embedding whose table the output layer reuses (``head.weight is emb.weight``)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.mid = nn.Linear(4, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.mid(self.emb(ids))))


def torch_names(model: nn.Module) -> dict[str, list[str]]:
    """Owner name -> every name torch knows the tensor by, owner first (torch's own record)."""
    out: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        out.setdefault(id(p), []).append(name)
    return {ns[0]: ns for ns in out.values()}


@pytest.mark.parametrize("method", ["export", "fx", "eager"])
def test_a_tied_weight_is_one_node_read_from_its_owner(method: str) -> None:
    torch.manual_seed(0)
    m = Tied().eval()
    assert m.head.weight is m.emb.weight
    names = torch_names(m)
    assert names["emb.weight"] == ["emb.weight", "head.weight"]
    g = fxviz.capture(m, (torch.tensor([[1, 2, 3]]),), method=method)
    g.validate()
    params = [n for n in g.nodes if n.kind == "parameter"]
    # one node per tensor, under the name torch lists first (named_parameters())
    assert sorted(n.target for n in params) == sorted(dict(m.named_parameters()))
    owner = g.node("emb.weight")
    assert owner.module == "emb" and owner.attrs["shared_with"] == names["emb.weight"][1:]
    assert all("tied_to" not in n.attrs for n in params)
    # the head's op reads the owner's node (the drawn edge starts there), and so does the embedding
    readers = {g.node(u).module for u in g.users()["emb.weight"]}
    assert readers == {"emb", "head"}
    head_ops = [n for n in g.ops if n.module == "head"]
    assert head_ops and all(Ref("emb.weight") in n.inputs for n in head_ops)
    # the stats count the tensor once, for its owner, as torch's parameters() does
    stats = g.annotations["stats"]
    assert stats["total_params"] == sum(p.numel() for p in m.parameters())
    assert stats["modules"]["head"]["params"] == 0


def test_mark_tied_renames_a_tensor_known_by_its_second_name_only() -> None:
    """A capture that met the tensor under the alias first and only (export names it by either):
    the node becomes the owner's, in the owner's module, and every reader follows."""
    m = Tied()
    meta = (TensorMeta((10, 4)),)
    nodes = [
        Node("ids", "input", "ids", outputs=(TensorMeta((1, 3), "int64"),)),
        Node("p_head_weight", "parameter", "head.weight", stack=(("head", 0),), outputs=meta),
        Node("embedding", "op", "aten.embedding.default", (Ref("p_head_weight"), Ref("ids")), (("emb", 0),)),
        Node("linear", "op", "aten.linear.default", (Ref("embedding"), Ref("p_head_weight")), (("head", 0),)),
        Node("out", "output", "output", (Ref("linear"),)),
    ]
    mark_tied(nodes, m)
    assert [n.name for n in nodes] == ["ids", "emb.weight", "embedding", "linear", "out"]
    w = nodes[1]
    assert (w.target, w.stack, w.attrs) == ("emb.weight", (("emb", 0),), {"shared_with": ["head.weight"]})
    assert nodes[2].inputs[0] == Ref("emb.weight") and nodes[3].inputs[1] == Ref("emb.weight")


def test_mark_tied_moves_the_owner_before_a_reader_of_the_alias() -> None:
    """Two nodes, the alias first (read first): one node stays, where the tensor was first met,
    so that it is made before anything reads it."""
    m = Tied()
    meta = (TensorMeta((10, 4)),)
    nodes = [
        Node("x", "input", "x", outputs=meta),
        Node("head.weight", "parameter", "head.weight", stack=(("head", 0),), outputs=meta, attrs={"tied_to": "emb.weight"}),
        Node("mul", "op", "aten.mul.Tensor", (Ref("x"), Ref("head.weight")), (("head", 0),), outputs=meta),
        Node("emb.weight", "parameter", "emb.weight", stack=(("emb", 0),), outputs=meta),
        Node("add", "op", "aten.add.Tensor", (Ref("mul"), Ref("emb.weight")), (("emb", 0),), outputs=meta),
    ]
    mark_tied(nodes, m)
    assert [n.name for n in nodes] == ["x", "emb.weight", "mul", "add"]
    assert nodes[2].inputs == (Ref("x"), Ref("emb.weight"))
    assert nodes[1].attrs == {"shared_with": ["head.weight"]}
    fxviz.Graph(nodes=nodes).validate()


@pytest.fixture(scope="module")
def gpt2() -> tuple[nn.Module, fxviz.Graph]:
    pytest.importorskip("transformers")
    from tests.transformers_zoo import gpt2 as build

    model, args, kwargs = build(n_layer=1)
    return model, fxviz.capture(model, args, kwargs)


def test_gpt2_lm_head_reads_wte_weight_and_says_it_is_shared(gpt2: tuple[nn.Module, fxviz.Graph]) -> None:
    model, g = gpt2
    assert model.lm_head.weight is model.transformer.wte.weight  # torch's record of the tie
    assert torch_names(model)["transformer.wte.weight"] == ["transformer.wte.weight", "lm_head.weight"]
    assert "lm_head.weight" not in g
    (head,) = [n for n in g.ops if n.module == "lm_head"]
    assert Ref("transformer.wte.weight") in head.inputs
    boxes = module_boxes(g, group_values=True)
    assert boxes.node_group["transformer.wte.weight"] == "transformer.wte#0"  # drawn inside wte
    data = view_model(g)
    names = data["nodes"]["n"]
    wte_weight = names.index("transformer.wte.weight")
    by_path = {grp["path"]: grp for grp in data["groups"]}
    assert by_path["lm_head"]["sh"] == [["weight", "transformer.wte", wte_weight]]
    assert by_path["lm_head"]["params"] == 0
    # the head's op reads the shared weight: its details count it
    assert data["nodes"]["np"][names.index(head.name)] == model.lm_head.weight.numel()


def test_each_call_of_a_shared_module_counts_its_own_ops() -> None:
    """The example CNN calls one max_pool three times: three boxes, each holding the ops of its
    call, counted here from torch's own run (the torch functions called inside each call)."""
    model, args = examples.cnn()
    per_call: list[int] = []
    inside: list[int] = []

    class Count(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, a: Any = (), kw: Any = None) -> Any:
            if inside:
                inside[-1] += 1
            return func(*a, **(kw or {}))

    pre = model.max_pool.register_forward_pre_hook(lambda *_: inside.append(0))
    post = model.max_pool.register_forward_hook(lambda *_: per_call.append(inside.pop()))
    with torch.no_grad(), Count():
        model(*args)
    pre.remove()
    post.remove()
    assert per_call == [1, 1, 1]
    g = fxviz.capture(model, args)
    pools = [grp for grp in view_model(g)["groups"] if grp["path"] == "max_pool"]
    assert [(p["call"], p["ops"]) for p in pools] == [(0, per_call[0]), (1, per_call[1]), (2, per_call[2])]
    # the module as a whole ran all three (the stats of the module, not of a box)
    assert g.annotations["stats"]["modules"]["max_pool"]["ops"] == sum(per_call)


def test_words_say_how_the_graph_was_captured_and_count_in_the_singular() -> None:
    assert captured_by("eager") == "captured by the eager tracer"
    assert captured_by("export") == "captured by torch.export"
    assert captured_by("something-new") == "captured by something-new"
    assert (counted(1, "op"), counted(0, "op"), counted(1234, "op")) == ("1 op", "0 ops", "1,234 ops")
    model, args = examples.cnn()
    g = fxviz.capture(model, args, method="export")
    assert view_model(g)["captured"] == "captured by torch.export"
    assert "1 ops" not in str(g)


def test_the_terminal_tree_and_the_report_say_how_the_graph_was_captured_in_the_same_words() -> None:
    assert captured_by("export (.pt2)") == "captured by torch.export (.pt2)"  # a loaded .pt2 keeps its note
    assert captured_by("eager (fake)") == "captured by the eager tracer on fake tensors"
    assert captured_by("") == captured_by(None) == "captured by an unknown method"
    model, args = examples.cnn()
    for method in ("export", "eager"):
        g = fxviz.capture(model, args, method=method)
        assert g.method == method
        header = str(g).splitlines()[0]
        assert header.startswith(f"CoolCNN  {view_model(g)['captured']}  ·"), header
    assert str(g).splitlines()[0].startswith("CoolCNN  captured by the eager tracer  ·")


def test_an_exported_op_names_its_torch_call_as_a_user_writes_it() -> None:
    model, args = examples.cnn()
    g = fxviz.capture(model, args, method="export")
    calls = {n.name: n.attrs["torch_fn"][1] for n in g.ops if "torch_fn" in n.attrs}
    relu = next(n for n in g.ops if n.target == "aten.relu.default")
    # torch's own name of the function forward calls (examples.CoolCNN.forward: torch.relu)
    assert calls[relu.name] == resolve_name(torch.relu) == "torch.relu"
    conv = next(n for n in g.ops if n.module == "initial_conv")
    assert calls[conv.name] == resolve_name(nn.functional.conv2d) == "torch.nn.functional.conv2d"
    # the eager tracer spells the same calls the same way
    e = fxviz.capture(model, args, method="eager")
    assert {n.target for n in e.ops} >= {"torch.relu", "torch.nn.functional.conv2d"}


def test_the_first_divergence_names_the_node_as_drawn_and_its_line() -> None:
    from fxviz.analyze.pipeline import pipeline
    from tests import pipeline_passes as pp

    model, args = examples.cnn()
    p = pipeline(model, args, passes=[pp.swap_add_for_sub])
    div = p.first_divergence
    assert div is not None and div.node == "add"
    stage = p.stages[div.stage]
    drawn = view_model(stage.graph)
    label = drawn["ops"][drawn["nodes"]["f"][drawn["nodes"]["n"].index("add")]][2]
    assert label == "sub"  # what the report draws for the node the pass rewrote
    lines, first = inspect.getsourcelines(examples.CoolCNN.forward)
    line = first + next(i for i, text in enumerate(lines) if "main_path + parallel_path" in text)
    assert div.where == node_origin(stage.graph, "add") == f"sub (node add) in the model itself at examples.py:{line}"
    assert f"at sub (node add) in the model itself at examples.py:{line}" in str(div)


def test_the_numerics_graph_says_the_same_of_a_tied_weight() -> None:
    """The numerics analyzer records its own eager graph: the tie reads the same there."""
    torch.manual_seed(0)
    m = Tied().eval()
    r = fxviz.numerics(m, (torch.tensor([[1, 2, 3]]),), against="dtype:bfloat16")
    assert r.graph.node("emb.weight").attrs["shared_with"] == torch_names(m)["emb.weight"][1:]
    data = view_model(r.graph)
    head = next(grp for grp in data["groups"] if grp["path"] == "head")
    assert head["sh"] == [["weight", "emb", data["nodes"]["n"].index("emb.weight")]]
