"""The plumbing pass: which ops are export's plumbing (masks, positions, sizes, checks, aliases,
wrappers), on hand-built IR where each rule is pinned, and on the export graphs of GPT-2 and T5."""

from __future__ import annotations

import pytest

from fxviz.ir import Graph, Node, Ref, TensorMeta
from fxviz.ops import op_family
from fxviz.passes import DEFAULT, run_passes
from fxviz.passes.plumbing import COMPUTE_FAMILIES, classify_plumbing, plumbing_of, plumbing_summary
from tests.irbuild import GraphBuilder

ATTN = (("attn", 0),)


def masked_attention(*, user_mask: bool = False) -> Graph:
    """An embedding, position ids, a causal mask built from aranges (and, with ``user_mask``, the
    user's ``attention_mask``), export's checks, and an attention that reads the mask."""
    b = GraphBuilder("Masked", {"wte": "Embedding", "wpe": "Embedding", "attn": "Attention", "ln": "LayerNorm"})
    b.param("wte.weight", (50, 8))
    b.param("wpe.weight", (16, 8))
    b.param("ln.weight", (8,))
    ids = b.input("input_ids", (1, 7), "int64")
    if user_mask:
        am = b.input("attention_mask", (1, 7), "int64")
    size = b._add(Node("sym_size_int", "op", target="aten.sym_size.int", inputs=(Ref(ids),),
                       outputs=(TensorMeta((), "int", value="s0"),)))
    n = b._add(Node("add_size", "op", target="_operator.add", inputs=(Ref(size),),
                    outputs=(TensorMeta((), "int", value="s0 + 1"),)))
    v = b.op("view", "aten.view.default", [ids, n], (1, 7), dtype="int64")
    emb = b.op("embedding", "aten.embedding.default", ["wte.weight", v], (1, 7, 8), (("wte", 0),))
    pos = b.op("arange", "aten.arange.default", [], (7,), dtype="int64")
    pos = b.op("add", "aten.add.Tensor", [pos], (7,), dtype="int64", other=0)
    pos = b.op("unsqueeze", "aten.unsqueeze.default", [pos], (1, 7), dtype="int64")
    pemb = b.op("embedding_1", "aten.embedding.default", ["wpe.weight", pos], (1, 7, 8), (("wpe", 0),))
    chk = b._add(Node("_assert_tensor_metadata_default", "op", target="aten._assert_tensor_metadata.default",
                      inputs=(Ref(pemb),), outputs=(TensorMeta((), "none"),)))
    assert chk
    same = b.op("to", "aten.to.dtype", [pemb], (1, 7, 8), dtype="float32")
    h = b.op("add_1", "aten.add.Tensor", [emb, same], (1, 7, 8))
    q = b.op("arange_1", "aten.arange.default", [], (7,), dtype="int64")
    q = b.op("unsqueeze_1", "aten.unsqueeze.default", [q], (7, 1), dtype="int64")
    k = b.op("arange_2", "aten.arange.default", [], (7,), dtype="int64")
    k = b.op("unsqueeze_2", "aten.unsqueeze.default", [k], (1, 7), dtype="int64")
    mask = b.op("le", "aten.le.Tensor", [k, q], (7, 7), dtype="bool")
    if user_mask:
        um = b.op("to_1", "aten.to.dtype", [am], (1, 7), dtype="bool")
        um = b.op("unsqueeze_3", "aten.unsqueeze.default", [um], (1, 1, 7), dtype="bool")
        mask = b.op("and_1", "aten.__and__.Tensor", [mask, um], (1, 7, 7), dtype="bool")
    mask = b.op("expand", "aten.expand.default", [mask], (1, 1, 7, 7), dtype="bool")
    x = b.op("layer_norm", "aten.layer_norm.default", [h, "ln.weight"], (1, 7, 8), (("ln", 0),))
    scores = b.op("matmul", "aten.matmul.default", [x, x], (1, 7, 7), ATTN)
    scores = b.op("masked_fill", "aten.masked_fill.Scalar", [scores, mask], (1, 7, 7), ATTN, value=-1e9)
    p = b.op("softmax", "aten.softmax.int", [scores], (1, 7, 7), ATTN)
    out = b.op("bmm", "aten.bmm.default", [p, x], (1, 7, 8), ATTN)
    out = b.op("alias", "aten.alias.default", [out], (1, 7, 8))
    out = b.op("detach", "aten.detach.default", [out], (1, 7, 8))
    b.output("output", out)
    return b.build()


def test_masks_positions_sizes_checks_and_aliases_are_plumbing() -> None:
    found = classify_plumbing(masked_attention())
    assert {n: found[n] for n in ("arange_1", "unsqueeze_1", "arange_2", "unsqueeze_2", "le", "expand")} == dict.fromkeys(
        ("arange_1", "unsqueeze_1", "arange_2", "unsqueeze_2", "le", "expand"), "mask")
    assert [found[n] for n in ("arange", "add", "unsqueeze")] == ["position"] * 3
    assert found["sym_size_int"] == found["add_size"] == "shape"
    assert found["_assert_tensor_metadata_default"] == "assert"
    assert found["to"] == "alias"  # converts to the dtype it has: nothing happens
    assert found["alias"] == "alias" and found["detach"] == "detach"


def test_computation_is_never_plumbing() -> None:
    g = masked_attention(user_mask=True)
    found = classify_plumbing(g)
    for name in ("view", "embedding", "embedding_1", "add_1", "layer_norm", "matmul", "masked_fill", "softmax", "bmm"):
        assert name not in found, name  # the reshaped input_ids feed an embedding: the data path
    assert not any(op_family(g.node(n).target) in COMPUTE_FAMILIES for n in found)


def test_a_mask_made_from_the_users_attention_mask_is_plumbing() -> None:
    found = classify_plumbing(masked_attention(user_mask=True))
    assert [found.get(n) for n in ("to_1", "unsqueeze_3", "and_1", "expand")] == ["mask"] * 4
    assert "view" not in found  # input_ids, also an integer input, on their way into the embedding


def test_data_free_floats_the_model_computes_with_stay_computation() -> None:
    """A sinusoidal position table is made from an arange alone, but it is computed: its float
    arithmetic stays visible; a float turned back into an index (T5's buckets) is plumbing."""
    b = GraphBuilder("Sinusoid")
    x = b.input("x", (7, 8))
    t = b.op("arange", "aten.arange.start", [], (7,), dtype="float32")
    t = b.op("mul", "aten.mul.Tensor", [t], (7,), other=0.5)
    t = b.op("sin", "aten.sin.default", [t], (7,))
    t = b.op("unsqueeze", "aten.unsqueeze.default", [t], (7, 1))
    y = b.op("add", "aten.add.Tensor", [x, t], (7, 8))
    r = b.op("arange_1", "aten.arange.default", [], (7,), dtype="int64")
    f = b.op("to", "aten.to.dtype", [r], (7,), dtype="float32")
    f = b.op("log", "aten.log.default", [f], (7,))
    i = b.op("to_1", "aten.to.dtype", [f], (7,), dtype="int64")
    b.param("bias.weight", (7, 8))
    e = b.op("embedding", "aten.embedding.default", ["bias.weight", i], (7, 8))
    b.output("output", b.op("add_1", "aten.add.Tensor", [y, e], (7, 8)))
    found = classify_plumbing(b.build())
    assert "mul" not in found and "sin" not in found and "unsqueeze" not in found and "add" not in found
    assert [found.get(n) for n in ("arange_1", "to", "log", "to_1")] == ["position"] * 4


def test_wrappers_are_plumbing_only_where_the_graph_shows_their_bodies() -> None:
    def wrapped(inlined: bool) -> Graph:
        b = GraphBuilder("NoGrad", {"t": "Linear"})
        x = b.input("x", (2, 4))
        w = b.op("wrap", "torch.ops.higher_order.wrap_with_set_grad_enabled", [x], (2, 4))
        g = b.op("getitem", "_operator.getitem", [w], (2, 4), (("t", 0),))
        lin = b.op("linear", "aten.linear.default", [g], (2, 4), (("t", 0),))
        if inlined:  # issue 9: the body's ops are in the graph, inside a region
            b.g.node("linear").attrs["region"] = [[0, "r0", "no_grad"]]
        b.output("output", lin)
        return b.build()

    assert classify_plumbing(wrapped(False)) == {}  # the wrapper stands for a body nobody sees
    assert classify_plumbing(wrapped(True)) == {"wrap": "wrapper", "getitem": "wrapper"}


def test_what_raised_and_data_dependent_exits_are_never_plumbing() -> None:
    b = GraphBuilder("Gate")
    b.input("x", (2,))
    s = b.op("arange", "aten.arange.default", [], (3,), dtype="int64")
    item = b.op("item", "aten.item.default", [s], ())
    b.g.node(item).attrs["data_dependent"] = True
    bad = b.op("arange_1", "aten.arange.default", [], (3,), dtype="int64")
    b.g.node(bad).error = "RuntimeError: boom"
    found = classify_plumbing(b.build())
    assert found == {"arange": "position"}


def test_the_pass_writes_a_category_overlay_and_is_idempotent() -> None:
    g = masked_attention()
    first = g.annotations["overlays"]["plumbing"]
    assert first["kind"] == "category" and first["nodes"] == plumbing_of(g) == classify_plumbing(g)
    assert set(first["categories"]) == set(first["nodes"].values())
    assert run_passes(g, DEFAULT).annotations["overlays"]["plumbing"] == first
    assert Graph.from_json(g.to_json()).annotations["overlays"]["plumbing"] == first


def test_summary_names_the_count_and_the_categories_most_frequent_first() -> None:
    plumbing = {"a": "mask", "b": "mask", "c": "shape"}
    assert plumbing_summary(["a", "b", "c", "d"], plumbing) == "3 plumbing ops (mask, shape)"
    assert plumbing_summary(["c"], plumbing) == "1 plumbing op (shape)"
    assert plumbing_summary(["d"], plumbing) == ""


# ---- real export graphs ----------------------------------------------------------------------------

NEVER = ("linear", "addmm", "mm", "matmul", "bmm", "layer_norm", "softmax", "_softmax", "scaled_dot_product_attention",
         "embedding", "rsqrt", "mean", "pow", "tanh", "relu", "gelu", "dropout")


@pytest.fixture(scope="module")
def exported() -> dict[str, Graph]:
    import fxviz
    from tests import transformers_zoo

    out = {}
    for name in ("gpt2", "t5"):
        model, args, kwargs = getattr(transformers_zoo, name)()
        out[name] = fxviz.capture(model, args, kwargs, method="export")
    return out


def _short(g: Graph, name: str) -> str:
    from fxviz.ops import short_name

    return short_name(g.node(name).target)


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_export_graphs_plumbing_is_mask_and_position_construction_never_compute(
        exported: dict[str, Graph], name: str) -> None:
    g = exported[name]
    found = plumbing_of(g)
    assert found, "the pass ran at capture"
    assert not [n for n in found if _short(g, n) in NEVER]
    # the causal mask: its comparison and expand are plumbing, and so is everything they are made of
    masks = [n.name for n in g.ops if _short(g, n.name) in ("le", "ge") and n.meta is not None and n.meta.dtype == "bool"]
    assert masks and all(found.get(m) == "mask" for m in masks)
    for m in masks:
        todo = [r.node for r in g.node(m).inputs]
        while todo:
            x = g.node(todo.pop())
            if x.kind == "op":
                assert x.name in found, x.name
                todo.extend(r.node for r in x.inputs)
    assert all(found.get(n.name) == "assert" for n in g.ops if _short(g, n.name) == "_assert_tensor_metadata")
    # every op that reads a parameter computes
    params = {n.name for n in g.nodes if n.kind == "parameter"}
    assert not [n for n in found if any(r.node in params for r in g.node(n).inputs)]


def test_gpt2_position_ids_and_root_alias(exported: dict[str, Graph]) -> None:
    g = exported["gpt2"]
    found = plumbing_of(g)
    wpe = next(n for n in g.ops if n.module == "transformer.wpe")
    ids = g.node(wpe.inputs[1].node)  # embedding(weight, position ids)
    assert found.get(ids.name) == "position"
    assert [found.get(n.name) for n in g.ops if _short(g, n.name) == "alias"] == ["alias"]
    first = next(n for n in g.ops if n.module == "transformer")  # view of input_ids, into wte
    assert _short(g, first.name) == "view" and first.name not in found
