"""The terminal tree: golden files on hand-built IR (torch releases rename nodes; hand-built graphs
don't change), fixed width, no colour. Regenerate with FXVIZ_UPDATE_GOLDEN=1 after a deliberate
change, and read the diff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import rich
from rich.console import Console

from fxviz.errors import RenderError
from fxviz.ir import Graph
from tests.irbuild import cnn_graph, stack_graph
from tests.render_graphs import partial_graph

GOLDEN = Path(__file__).parent / "golden"


def render(renderable: object, width: int = 100) -> str:
    with open(os.devnull, "w") as sink:
        console = Console(width=width, color_system=None, record=True, file=sink)
        console.print(renderable)
    return console.export_text()


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("FXVIZ_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; FXVIZ_UPDATE_GOLDEN=1 rewrites it"


@pytest.mark.parametrize(
    ("name", "graph", "options"),
    [
        ("cnn_tree.txt", cnn_graph, {}),
        ("stack_tree.txt", stack_graph, {}),
        ("stack_tree_unfold.txt", stack_graph, {"unfold": True}),
        ("stack_tree_depth1.txt", stack_graph, {"depth": 1}),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_tree_golden(name: str, graph, options: dict) -> None:
    check_golden(name, render(graph().tree(**options)))


def test_cnn_branches_are_parallel_and_join_at_the_add() -> None:
    text = render(cnn_graph().tree())
    lines = text.splitlines()
    fork = next(i for i, line in enumerate(lines) if "2 parallel branches" in line)
    assert "join at add" in lines[fork]
    assert "initial_conv (Conv2d) → relu → max_pool (MaxPool2d)" in lines[fork + 1]
    assert "parallel_conv (Conv2d) → relu → max_pool (MaxPool2d)" in lines[fork + 2]
    assert lines[fork + 3].lstrip("├└─│ ").startswith("add")


def test_folded_stack_shows_one_block_with_count() -> None:
    text = render(stack_graph(layers=5).tree())
    assert "h.0-4 ×5 (Block)" in text
    assert text.count("(LayerNorm)") == 1
    unfolded = render(stack_graph(layers=5).tree(unfold=True))
    assert unfolded.count("(LayerNorm)") == 5
    assert "×5" not in unfolded


def test_header_names_method_and_failed_attempts() -> None:
    from fxviz.ir import Attempt

    g = cnn_graph()
    g.method = "fx"
    g.attempts = [Attempt("export", False, 0.1, "UserError", "data-dependent branch\nmore"), Attempt("fx", True)]
    text = render(g.tree())
    assert text.splitlines()[0].startswith("CoolCNN  captured by torch.fx symbolic tracing")
    assert "✗ export failed: UserError: data-dependent branch" in text


def test_rich_print_and_str_render_the_tree(capsys: pytest.CaptureFixture[str]) -> None:
    g = cnn_graph()
    rich.print(g)
    printed = capsys.readouterr().out
    assert "parallel branches" in printed
    assert str(g).splitlines()[0] == render(g.tree(), width=120).splitlines()[0]


def test_tree_of_json_round_trip_is_identical() -> None:
    g = stack_graph()
    assert render(Graph.from_json(g.to_json()).tree()) == render(g.tree())


# ---- widths, plumbing, outputs, overlays -------------------------------------------------------------


def decoder_graph() -> Graph:
    """A decoder that returns a cache: a block whose boundary lists many shapes, outputs of one
    container, and a long module path, to pin how lines break at each width."""
    from tests.irbuild import GraphBuilder

    b = GraphBuilder("Decoder", {"model": "DecoderModel", "model.layers": "ModuleList",
                                 "model.layers.0": "DecoderLayerWithAVeryLongClassName",
                                 "model.layers.0.self_attn": "Attention", "lm_head": "Linear"})
    b.param("model.layers.0.self_attn.q.weight", (768, 768))
    b.param("lm_head.weight", (50257, 768))
    x = b.input("hidden", (1, 128, 768))
    outer = (("model", 0), ("model.layers.0", 0), ("model.layers.0.self_attn", 0))
    q = b.op("linear", "aten.linear.default", [x, "model.layers.0.self_attn.q.weight"], (1, 128, 768), outer)
    caches = [b.op(f"view_{i}", "aten.view.default", [q], (1, 12, 128, 64), outer) for i in range(6)]
    h = b.op("add", "aten.add.Tensor", [x, q], (1, 128, 768), outer[:2])
    logits = b.op("linear_1", "aten.linear.default", [h, "lm_head.weight"], (1, 128, 50257), (("lm_head", 0),))
    b.output("logits", logits)
    for i, c in enumerate(caches):
        b.output(f"past_key_values.layers[{i // 2}].{'keys' if i % 2 == 0 else 'values'}", c)
    return b.build()


def masked_graph() -> Graph:
    from tests.test_plumbing import masked_attention

    return masked_attention(user_mask=True)


GRAPHS = {"cnn": cnn_graph, "decoder": decoder_graph, "masked": masked_graph, "partial": partial_graph}


@pytest.mark.parametrize("width", [80, 100, 200])
@pytest.mark.parametrize("name", list(GRAPHS))
def test_tree_golden_at_each_width(name: str, width: int) -> None:
    text = render(GRAPHS[name]().tree(), width=width)
    check_golden(f"{name}_tree_w{width}.txt", text)
    for line in text.splitlines():
        assert len(line) <= width, line
        # a shape is never cut: each line closes every bracket it opens
        assert line.count("[") == line.count("]"), line


def test_plumbing_is_one_line_per_call_and_shown_on_request() -> None:
    from fxviz.passes.plumbing import plumbing_of

    g = masked_graph()
    text = render(g.tree(), width=120)
    assert text.count("plumbing op") == 1
    found = plumbing_of(g)
    mine = [n for n in g.calls.root.ops if n in found]
    assert len(mine) == 18  # all of this graph's plumbing runs in the model's own forward
    assert "├── … 18 plumbing ops (mask, position, shape, alias, assert, detach)\n" in text
    assert "arange" not in text and "_assert_tensor_metadata" not in text
    shown = render(g.tree(plumbing=True), width=120)
    assert "plumbing op" not in shown and "arange" in shown and "_assert_tensor_metadata" in shown


def test_a_parallel_group_names_a_join_only_where_it_joins() -> None:
    """GPT-2's mask is built beside the main path and read deep inside the blocks: the step after
    it (the dropout) does not join it. The CNN's branches do join at the add."""
    from tests.irbuild import GraphBuilder

    b = GraphBuilder("Masky", {"drop": "Dropout", "blk": "Block"})
    x = b.input("x", (7, 7))
    h = b.op("relu", "aten.relu.default", [x], (7, 7))
    q = b.op("unsqueeze", "aten.unsqueeze.default", [b.op("arange", "aten.arange.default", [], (7,), dtype="int64")],
             (7, 1), dtype="int64")
    k = b.op("unsqueeze_1", "aten.unsqueeze.default", [b.op("arange_1", "aten.arange.default", [], (7,),
                                                                  dtype="int64")], (1, 7), dtype="int64")
    b.op("unsqueeze_2", "aten.unsqueeze.default", [b.op("arange_2", "aten.arange.default", [], (1,),
                                                                  dtype="int64")], (1, 1), dtype="int64")
    mask = b.op("expand", "aten.expand.default", [b.op("le", "aten.le.Tensor", [k, q], (7, 7), dtype="bool")],
                (7, 7), dtype="bool")
    d = b.op("dropout", "aten.dropout.default", [h], (7, 7), (("drop", 0),))
    mm = b.op("mm", "aten.mm.default", [d, d], (7, 7), (("blk", 0),))
    b.output("out", b.op("masked_fill", "aten.masked_fill.Scalar", [mm, mask], (7, 7), (("blk", 0),)))
    text = render(b.build().tree(plumbing=True), width=120)
    fork = next(line for line in text.splitlines() if "parallel branches" in line)
    assert fork.endswith("⑂ 2 parallel branches"), fork  # no "join at drop"
    assert "join at add" in render(cnn_graph().tree())


def test_outputs_of_one_container_are_one_line() -> None:
    text = render(decoder_graph().tree(), width=120)
    assert "◀ past_key_values  6 outputs  [1, 12, 128, 64] float32 ×6" in text
    assert text.count("◀") == 2  # logits, and the cache


def test_depth_zero_is_the_models_own_line() -> None:
    g = partial_graph()
    assert render(g.tree(depth=0)).strip() == "Gated  captured by the eager tracer (partial)  ·  64 params  ·  4 ops"


def test_an_overlay_is_a_column_at_the_right_edge() -> None:
    g = cnn_graph()
    text = render(g.tree(overlay="params"), width=100)
    lines = text.splitlines()
    assert lines[0].endswith("·  parameters")
    fc = next(line for line in lines if line.startswith("├── fully_connected1"))
    assert fc.endswith("262.3K params") and len(fc) == 100
    relu = next(line for line in lines if line.startswith("├── relu"))
    assert relu.endswith("]")  # reads no parameter: no value
    with pytest.raises(RenderError, match="no overlay 'heat'"):
        render(g.tree(overlay="heat"))
