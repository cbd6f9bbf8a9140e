"""The HTML report without a browser: the embedded view-model, escaping, size."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from fxviz.errors import RenderError
from fxviz.ir import Graph, Ref
from fxviz.render import html as html_mod
from fxviz.render.html import repr_html, split_view_model, to_html, view_model
from tests.irbuild import GraphBuilder, cnn_graph, stack_graph
from tests.render_graphs import HOSTILE, hostile_graph, partial_graph
from tests.viewmodel import node_rows, page_data

#: For the tests that render a whole report: the script bundle (a fixture of tests/conftest.py).
#: The view-model tests need no bundle.
with_bundle = pytest.mark.usefixtures("bundle")


def embedded(text: str) -> dict:
    return page_data(text)


@with_bundle
def test_embedded_json_round_trips() -> None:
    g = partial_graph()
    text = to_html(g)
    assert embedded(text) == json.loads(json.dumps(view_model(g)))
    data = embedded(text)
    nodes = node_rows(data)
    names = [n["n"] for n in nodes]
    assert names == [n.name for n in g.nodes]
    item = nodes[names.index("item")]
    assert item["e"].startswith("RuntimeError") and data["error"]
    assert [a["method"] for a in data["attempts"]] == ["export", "fx", "eager"]
    assert data["attempts"][0]["reason"] == g.attempts[0].reason()
    linear = nodes[names.index("linear")]
    assert data["metas"][linear["out"][0]] == ["[2, 8]", "float32", "2×8 f32"]
    assert data["groups"][linear["g"]]["path"] == "enc.fc"


def test_the_first_block_holds_what_the_first_view_needs_and_the_second_the_rest() -> None:
    g = partial_graph()
    g.node("linear").attrs = {"bias": True}
    g.nodes[0].attrs = {"note": "\U0001F600 </script>"}  # two UTF-16 units, and text to escape
    data = view_model(g, overlay="params")
    first, later = split_view_model(data)
    assert not {"a", "al"} & set(first["nodes"]) and later["nodes"] == {k: data["nodes"][k] for k in ("a", "al")}
    # boundaries: details only
    assert [{**g, **({"ins": io[0]} if io[0] else {}), **({"outs": io[1]} if io[1] else {})}
            for g, io in zip(first["groups"], later["boundaries"], strict=True)] == data["groups"]
    assert not any("ins" in g or "outs" in g for g in first["groups"]) and any(io[0] for io in later["boundaries"])
    rows = node_rows({**first, "nodes": {**first["nodes"], **later["nodes"]}})
    assert [r.get("a") for r in rows if "a" in r] == [{"note": "\U0001F600 </script>"}, {"bias": True}]
    assert later["nodes"]["al"][0] == len('{"note":"') + 2 + len(' </script>"}')  # UTF-16 units
    # the overlay the report opens with keeps its values; the others' are in the second block
    assert [o["name"] for o in first["overlays"] if "nodes" in o] == ["params"]
    assert set(later["overlays"]) == {o["name"] for o in data["overlays"]} - {"params"} != set()
    for o, whole in zip(first["overlays"], data["overlays"], strict=True):
        values = {"nodes": whole["nodes"], "groups": whole["groups"]}
        assert {**o, **later["overlays"].get(o["name"], {})} == whole
        assert later["overlays"].get(o["name"], values) == values


@with_bundle
def test_hostile_names_cannot_break_out() -> None:
    text = to_html(hostile_graph())
    # the only script tags are the four the template writes (the script, the data's two blocks,
    # the event between them)
    assert text.lower().count("<script") == 4 and text.lower().count("</script") == 4
    assert "<img" not in text
    data = embedded(text)
    assert data["nodes"]["n"][0] == HOSTILE  # the name survives, as data
    assert data["name"] == f"Evil{HOSTILE}"
    title = re.search(r"<title>(.*?)</title>", text, re.S)
    assert title is not None and "&lt;/script&gt;" in title.group(1)


@with_bundle
def test_repr_html_is_an_isolated_iframe() -> None:
    a, b = repr_html(partial_graph()), repr_html(partial_graph())
    assert a.startswith("<iframe") and 'sandbox="allow-scripts' in a
    ids = [re.search(r'id="([^"]+)"', x).group(1) for x in (a, b)]  # type: ignore[union-attr]
    assert ids[0] != ids[1]
    assert "<script" not in a  # all of the report is inside the escaped srcdoc


@with_bundle
def test_size_budget() -> None:
    """The fixed part (script, styles, template) stays far under the 1.5 MB budget."""
    text = to_html(partial_graph())
    data = re.search(r'id="fxviz-data">(.*?)</script>', text, re.S).group(1)  # type: ignore[union-attr]
    assert len(text.encode()) - len(data.encode()) < 1_500_000
    assert len(text.encode()) - len(data.encode()) < 200_000  # dagre + app today: ~80 kB


@with_bundle
def test_writes_the_file(tmp_path) -> None:
    out = tmp_path / "r.html"
    text = to_html(partial_graph(), out)
    assert out.read_text(encoding="utf-8") == text


def test_missing_bundle_says_how_to_build(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(html_mod, "BUNDLE_DIR", tmp_path)
    html_mod._bundle.cache_clear()
    try:
        with pytest.raises(RenderError, match="scripts/build_web.sh"):
            to_html(partial_graph())
    finally:
        html_mod._bundle.cache_clear()


@with_bundle
def test_unwritable_path(tmp_path) -> None:
    with pytest.raises(RenderError, match="cannot write"):
        to_html(partial_graph(), tmp_path / "missing" / "r.html")


# ---- the view-model carries every fact the script shows --------------------------------------


def refs(data: dict[str, Any], encoded: list[Any]) -> list[Ref]:
    """Decode the view-model's value references (index, or [index, output]) to Refs."""
    names = data["nodes"]["n"]
    return [Ref(names[r]) if isinstance(r, int) else Ref(names[r[0]], r[1]) for r in encoded]


def box(data: dict[str, Any], path: str, *, run: bool = False) -> dict[str, Any]:
    return next(g for g in data["groups"] if g["path"] == path and bool(g["run"]) == run)


@pytest.mark.parametrize("make", [cnn_graph, partial_graph, stack_graph], ids=["cnn", "partial", "stack"])
def test_each_module_call_box_carries_its_calls_boundary(make: Any) -> None:
    g = make()
    data = view_model(g)
    tree = g.calls
    checked = 0
    for c in tree.walk():
        if not c.stack:
            continue
        entry = next(x for x in data["groups"] if x["path"] == c.path and x["call"] == c.index and not x["run"])
        assert refs(data, entry.get("ins", [])) == c.inputs
        assert refs(data, entry.get("outs", [])) == c.outputs
        checked += 1
    assert checked == sum(1 for c in tree.walk() if c.stack) > 0


def test_cnn_boxes_read_and_hand_back_what_the_model_does() -> None:
    data = view_model(cnn_graph())
    # the shared max_pool is three boxes, one per call, each with its own boundary
    pools = [x for x in data["groups"] if x["path"] == "max_pool"]
    assert [refs(data, p["ins"]) for p in pools] == [[Ref("relu")], [Ref("relu_1")], [Ref("relu_2")]]
    assert [refs(data, p["outs"]) for p in pools] == [[Ref("max_pool2d")], [Ref("max_pool2d_1")], [Ref("max_pool2d_2")]]
    fc = box(data, "fully_connected1")
    assert refs(data, fc["ins"]) == [Ref("view")]  # the weight and bias are state, not inputs
    assert refs(data, fc["outs"]) == [Ref("linear")]


def test_a_folded_run_reads_and_hands_back_what_its_members_share_with_the_outside() -> None:
    data = view_model(stack_graph(layers=3))
    run = box(data, "h.0-2", run=True)
    assert run["run"] == 3
    assert refs(data, run["ins"]) == [Ref("x")]  # add_0 -> ln_1 stays inside the run
    assert refs(data, run["outs"]) == [Ref("add_2")]
    # a member hands its result to the next member: its own box says so
    assert refs(data, box(data, "h.0")["outs"]) == [Ref("add_0")]


def test_a_box_of_model_outputs_reads_what_the_model_returns_through_it() -> None:
    b = GraphBuilder("Cache", {"blk": "Block"})
    x = b.input("x", (2, 4))
    kv = [b.op(f"k{i}", "aten.mul.Tensor", [x], (2, 4), (("blk", 0),)) for i in range(3)]
    out = b.op("y", "aten.relu.default", [x], (2, 4))
    b.output("y_out", out)
    for i, k in enumerate(kv):
        b.output(f"cache[{i}]", k)
    g = b.build()
    data = view_model(g)
    cache = next(x for x in data["groups"] if x.get("io") == "output")
    assert cache["path"] == "cache" and cache["n"] == 3
    assert refs(data, cache["ins"]) == [Ref("k0"), Ref("k1"), Ref("k2")] and "outs" not in cache
    assert refs(data, box(data, "blk")["outs"]) == [Ref("k2"), Ref("k1"), Ref("k0")]  # last made first


def test_nodes_carry_their_inputs_and_the_parameters_they_read() -> None:
    g = cnn_graph()
    data = view_model(g)
    nodes = node_rows(data)
    for n, node in zip(nodes, g.nodes, strict=True):
        assert refs(data, n["i"]) == list(node.inputs)  # readers are not written: the script reads inputs backwards
        assert len(n["out"]) == len(node.outputs)
    by_name = {n["n"]: n for n in nodes}
    assert by_name["linear"]["np"] == 2048 * 128 + 128  # weight and bias
    assert by_name["fully_connected1.weight"]["np"] == 2048 * 128
    assert "np" not in by_name["relu"] and "np" not in by_name["x"]


def test_an_op_reading_one_parameter_twice_counts_it_once() -> None:
    b = GraphBuilder("Tied", {"fc": "Linear"})
    w = b.param("fc.weight", (4, 4))
    x = b.input("x", (2, 4))
    y = b.op("mm", "aten.mm.default", [x, w], (2, 4), (("fc", 0),))
    z = b.op("both", "aten.addmm.default", [y, w, w], (2, 4), (("fc", 0),))
    b.output("out", z)
    data = view_model(b.build())
    assert next(n for n in node_rows(data) if n["n"] == "both")["np"] == 16


def test_boxes_around_the_failing_op_are_marked() -> None:
    g = partial_graph()
    data = view_model(g)
    marked = {x["path"] for x in data["groups"] if x.get("err")}
    assert marked == {"gate"}  # item raised inside gate; enc ran fine
    assert all(x.get("err") in (None, 1) for x in data["groups"])


# ---- boxes of every kind, overlays, words for a raising model ----------------------------------------


def test_each_box_says_its_kind_and_plumbing_is_one_box_per_module() -> None:
    from tests.test_plumbing import masked_attention

    g = masked_attention(user_mask=True)
    data = view_model(g)
    kinds = {x.get("k", "module") for x in data["groups"]}
    assert kinds == {"module", "plumbing"}
    (box,) = [x for x in data["groups"] if x.get("k") == "plumbing"]
    assert box["l"].startswith("18 plumbing ops (mask") and box["n"] == 18 and box["p"] == -1
    inside = {n["n"] for n in node_rows(data) if n["g"] == data["groups"].index(box)}
    assert {"arange", "le", "expand", "sym_size_int", "_assert_tensor_metadata_default", "to_1"} <= inside
    assert not inside & {"view", "matmul", "softmax", "bmm", "layer_norm"}
    # what the box hands on: the mask the attention reads, the position ids, the checked embedding
    outs = {n.node for n in refs(data, box["outs"])}
    assert {"expand", "unsqueeze", "to"} <= outs
    assert {r.node for r in refs(data, box["ins"])} >= {"input_ids", "attention_mask"}


def test_a_raising_models_headline_says_it_raised() -> None:
    g = partial_graph()
    data = view_model(g)
    assert data["headline"].startswith("The model raised during the eager capture")
    assert "Before that, export, fx failed." in data["headline"]
    assert [a.get("raised") for a in data["attempts"]] == [None, None, 1]
    assert view_model(cnn_graph())["headline"] == "Captured by export."


def test_labels_and_paths_are_bounded_and_the_details_keep_the_full_text() -> None:
    g = stack_graph(layers=1)
    long = "L" * 5000
    g.modules["h.0.ln"] = type(g.modules["h.0.ln"])(long)
    g.node("ln_0").target = f"aten.{long}.default"
    data = view_model(g)
    ln = next(x for x in data["groups"] if x["path"] == "h.0.ln")
    assert len(ln["l"]) <= 200 and ln["cls"] == long  # the details panel keeps the class
    node = next(n for n in node_rows(data) if n["n"] == "ln_0")
    assert len(node["l"]) <= 200 and node["t"] == f"aten.{long}.default"


def test_a_notebook_report_is_the_file_escaped_for_a_single_quoted_attribute(bundle: Any) -> None:
    import html as html_lib
    import json as json_lib

    g = partial_graph()
    frame = repr_html(g)
    m = re.search(r"srcdoc='([^']*)'", frame)
    assert m is not None and "<" not in m.group(1) and "'" not in m.group(1)
    doc = html_lib.unescape(m.group(1))
    assert doc == to_html(g)  # the standalone report, exactly
    assert len(json_lib.dumps(frame, ensure_ascii=False)) <= 1.2 * len(doc)  # what a notebook stores


# ---- the diff page's data ------------------------------------------------------------------------------


def test_diff_page_data_pairs_nodes_and_boxes_and_words_every_difference() -> None:
    from fxviz.graphdiff import diff
    from fxviz.render.diffpage import diff_view_model

    a = stack_graph(layers=2)
    b = Graph.from_json(a.to_json())
    b.node("fc_1").target = "aten.matmul.default"
    data = diff_view_model(diff(a, b, labels=("old", "new")))
    assert data["v"] == 4
    d = data["diff"]
    assert d["labels"] == ["old", "new"]
    na = d["a"]["nodes"]["n"]
    nb = d["b"]["nodes"]["n"]
    assert [na.index("ln_0"), nb.index("ln_0")] in d["pairs"] and [na.index("fc_0"), nb.index("fc_0")] in d["pairs"]
    words = {x["kind"]: x["words"] for x in d["differences"]}
    assert words == {"only_in_a": "only in old", "only_in_b": "only in new"}
    only_a = next(x for x in d["differences"] if x["kind"] == "only_in_a")
    assert [na[i] for i in only_a["a"]] == ["fc_1"] and only_a["b"] == []
    ga = [x["l"] for x in d["a"]["groups"]]
    gb = [x["l"] for x in d["b"]["groups"]]
    assert [ga.index("h.0 (Block)"), gb.index("h.0 (Block)")] in d["groupPairs"]
    overlay = next(o for o in d["a"]["overlays"] if o["name"] == "diff")
    assert d["a"]["overlay"] == "diff"
    assert overlay["nodes"][na.index("fc_1")] == "only_in_a" and overlay["nodes"][na.index("ln_0")] == "matched"
    assert overlay["categories"]["only_in_a"]["label"] == "only in old"
    assert overlay["groups"][ga.index("h.1 (Block)")] == "differs"
    assert d["summary"]["significant"] == 2 and d["failure"] is None


def test_diff_page_grows_linearly_with_the_nesting() -> None:
    """Three ops at depth 300 made a 9.4 MB page (a call's id written per section and row)."""
    from fxviz.graphdiff import diff
    from fxviz.ir import Node, TensorMeta

    def deep(depth: int) -> Graph:
        stack = tuple(("m" + ".m" * i, 0) for i in range(depth))
        t = (TensorMeta((2,), "float32"),)
        nodes = [Node("x", "input", target="x", outputs=t),
                 Node("a", "op", target="aten.relu.default", inputs=(Ref("x"),), stack=stack, outputs=t),
                 Node("b", "op", target="aten.neg.default", inputs=(Ref("a"),), stack=stack, outputs=t),
                 Node("c", "op", target="aten.exp.default", inputs=(Ref("b"),), stack=stack, outputs=t),
                 Node("out", "output", inputs=(Ref("c"),))]
        from fxviz.passes import DEFAULT, run_passes

        return run_passes(Graph(name="Deep", nodes=nodes, method="export"), DEFAULT)

    sizes = {}
    for depth in (100, 400):
        a, b = deep(depth), deep(depth)
        b.node("b").target = "aten.sin.default"
        sizes[depth] = len(diff(a, b).to_html())
    assert sizes[400] < 5 * sizes[100], sizes  # 4x the depth; the square would be 16x
    assert sizes[400] < 2_000_000
