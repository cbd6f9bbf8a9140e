"""Overlays: the mechanism (set, validate, read back), the built-in ones, overlays users bring
(their own JSON, Model Explorer's node data), how the view-model and the tree carry them, FLOPs
from torch's formulas, and the Model Explorer export."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fxviz.errors import GraphFormatError, RenderError, TargetError
from fxviz.ir import Graph
from fxviz.passes.overlays import overlays, read_overlay, set_overlay
from fxviz.render.html import view_model
from fxviz.render.modelexplorer import node_data, to_model_explorer, write_model_explorer
from tests.irbuild import cnn_graph, stack_graph
from tests.render_graphs import partial_graph


def by_name(data: dict[str, Any], overlay: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """An overlay of a view-model as node name -> value and box label -> value."""
    o = next(x for x in data["overlays"] if x["name"] == overlay)
    return ({k: v for k, v in zip(data["nodes"]["n"], o["nodes"], strict=True) if v is not None},
            {g["l"]: v for g, v in zip(data["groups"], o["groups"], strict=True) if v is not None})


def test_an_overlay_round_trips_through_json_and_the_view_model() -> None:
    g = stack_graph(layers=2)
    set_overlay(g, "latency", label="latency", kind="number", unit="ms", scale="linear", reduce="sum",
                nodes={"fc_0": 1.5, "fc_1": 2.5, "ln_0": None}, modules={"h.0#0": 4.0})
    back = Graph.from_json(g.to_json())
    assert back.annotations["overlays"]["latency"] == g.annotations["overlays"]["latency"]
    assert back.annotations["overlays"]["latency"]["nodes"] == {"fc_0": 1.5, "fc_1": 2.5}  # None left out
    nodes, boxes = by_name(view_model(back), "latency")
    assert nodes == {"fc_0": 1.5, "fc_1": 2.5}
    # h.0's own value; h.1 sums its nodes (reduce); the run sums its members
    assert boxes["h.0 (Block)"] == 4.0 and boxes["h.1 (Block)"] == 2.5 and boxes["h.0-1 ×2"] == 6.5
    entry = next(x for x in view_model(back)["overlays"] if x["name"] == "latency")
    assert (entry["min"], entry["max"], entry["unit"], entry["kind"]) == (1.5, 6.5, "ms", "number")


@pytest.mark.parametrize(("spec", "message"), [
    ({"kind": "heat"}, "'kind': expected 'number' or 'category'"),
    ({"kind": "number", "nodes": {"x": "hot"}}, r"'nodes'\['x'\]: expected a number or null"),
    ({"kind": "number", "nodes": {"x": True}}, "expected a number or null"),
    ({"kind": "category", "nodes": {"x": 3}}, "expected a category"),
    ({"kind": "number", "scale": "sqrt"}, "'scale': expected 'linear' or 'log'"),
    ({"kind": "category", "categories": {"a": {"color": "red"}}}, "'color': expected a colour '#rrggbb'"),
    # graph JSON schema 2 writes a per-module table as [path, value] pairs (an empty list is an
    # empty table); anything else is refused
    ({"kind": "number", "modules": "x"}, "'modules': expected an object"),
    ({"kind": "number", "modules": [["a"]]}, r"'overlays'\['mine'\] 'modules'\[0\]: expected \[module path, value\]"),
])
def test_a_saved_graph_with_a_malformed_overlay_is_refused_naming_it(spec: dict[str, Any], message: str) -> None:
    d = json.loads(stack_graph().to_json())
    d["annotations"]["overlays"] = {"mine": spec}
    with pytest.raises(GraphFormatError, match=message):
        Graph.from_dict(d)


def test_set_overlay_checks_what_it_writes() -> None:
    with pytest.raises(GraphFormatError, match="finite number"):
        set_overlay(stack_graph(), "x", label="x", kind="number", nodes={"fc_0": float("nan")})


def test_built_in_overlays_are_derived_never_stored() -> None:
    g = cnn_graph()
    assert not {"params", "bytes", "family"} & set(g.annotations["overlays"])  # nothing to go stale
    found = overlays(g)
    assert {"params", "bytes", "family"} <= set(found)
    assert found["params"]["nodes"]["linear"] == 2048 * 128 + 128  # what it reads, each parameter once
    assert found["params"]["nodes"]["fully_connected1.weight"] == 2048 * 128
    assert found["params"]["modules"]["fully_connected1#0"] == 2048 * 128 + 128
    assert found["bytes"]["nodes"]["conv2d"] == 16 * 32 * 32 * 4  # float32 [1, 16, 32, 32]
    assert found["family"]["nodes"]["conv2d"] == "conv" and found["family"]["nodes"]["max_pool2d"] == "pool"
    nodes, _ = by_name(view_model(g), "family")
    assert nodes["relu"] == "activation"
    entry = next(x for x in view_model(g)["overlays"] if x["name"] == "family")
    assert entry["categories"]["conv"]["color"] != entry["categories"]["pool"]["color"]


def test_the_report_opens_with_the_overlay_it_is_given() -> None:
    g = cnn_graph()
    assert view_model(g, overlay="params")["overlay"] == "params"
    assert view_model(g)["overlay"] is None
    with pytest.raises(RenderError, match="has no overlay 'heat'; it has: params, bytes, family"):
        view_model(g, overlay="heat")


# ---- overlays users bring ----------------------------------------------------------------------------


def test_a_users_file_maps_node_names_and_module_paths() -> None:
    g = cnn_graph()
    text = json.dumps({"conv2d": 0.5, "max_pool": 2.0, "fully_connected1": 3.0, "nothing_here": 1.0})
    name, spec, unmatched = read_overlay(text, g, where="my/errors.json")
    assert name == "errors" and spec["kind"] == "number" and unmatched == ["nothing_here"]
    assert spec["nodes"] == {"conv2d": 0.5}
    # a module path is every call of it: the shared max_pool ran three times
    assert spec["modules"] == {"max_pool#0": 2.0, "max_pool#1": 2.0, "max_pool#2": 2.0, "fully_connected1#0": 3.0}
    g.annotations.setdefault("overlays", {})[name] = spec
    nodes, boxes = by_name(view_model(g), "errors")
    assert nodes == {"conv2d": 0.5}
    assert boxes == {"max_pool (MaxPool2d)": 2.0, "max_pool (MaxPool2d) #2": 2.0, "max_pool (MaxPool2d) #3": 2.0,
                     "fully_connected1 (Linear)": 3.0}


def test_strings_make_a_category_overlay() -> None:
    g = cnn_graph()
    _, spec, _ = read_overlay('{"conv2d": "slow", "conv2d_1": "fast", "linear": "slow"}', g, where="speed.json")
    assert spec["kind"] == "category" and set(spec["categories"]) == {"slow", "fast"}
    g.annotations["overlays"] = {"speed": spec}
    nodes, _ = by_name(view_model(g), "speed")
    assert nodes == {"conv2d": "slow", "conv2d_1": "fast", "linear": "slow"}


def test_model_explorers_node_data_is_accepted_as_it_is() -> None:
    """GraphNodeData (``{"results": {node id: {"value", "bgColor"}}, "gradient"}``), and ModelNodeData
    (the same per graph id), as ``model_explorer.node_data_builder`` writes them."""
    g = cnn_graph()
    graph_data = {"results": {"conv2d": {"value": 3.5}, "relu": {"value": 1}, "nope": {"value": 2}},
                  "gradient": [{"stop": 0, "bgColor": "yellow"}, {"stop": 1, "bgColor": "red"}]}
    name, spec, unmatched = read_overlay(json.dumps(graph_data), g, where="latency.json")
    assert (name, spec["nodes"], unmatched) == ("latency", {"conv2d": 3.5, "relu": 1}, ["nope"])
    model_data = {"CoolCNN": {"results": {"linear": {"value": "int8", "bgColor": "#ff0000"},
                                          "linear_1": {"value": "fp16"}}}}
    _, spec, _ = read_overlay(json.dumps(model_data), g, where="quant.json")
    assert spec["kind"] == "category" and spec["nodes"] == {"linear": "int8", "linear_1": "fp16"}
    assert spec["categories"]["int8"]["color"] == "#ff0000"
    g.annotations["overlays"] = {"quant": spec}
    nodes, _ = by_name(view_model(g), "quant")
    assert nodes == {"linear": "int8", "linear_1": "fp16"}


@pytest.mark.parametrize(("text", "message"), [
    ("[1, 2]", "give a JSON object"),
    ("not json", "is not JSON"),
    ('{"zz": 1}', "none of the 1 keys in f.json names a node or a module of 'CoolCNN'"),
    ('{"conv2d": 1, "relu": "x"}', "mixes numbers and other values"),
    ('{"a": {"results": {}}, "b": {"results": {}}}', "node data for 2 graphs"),
])
def test_a_file_that_cannot_be_an_overlay_says_why(text: str, message: str) -> None:
    with pytest.raises(TargetError, match=message):
        read_overlay(text, cnn_graph(), where="f.json")


# ---- FLOPs: torch's formulas --------------------------------------------------------------------------


def test_flops_match_torchs_flop_counter_and_work_on_meta() -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    import fxviz
    from fxviz.examples import cnn

    model, args = cnn()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(*args)
    for method in ("export", "eager"):
        g = fxviz.capture(model, args, method=method)
        flops = g.annotations["overlays"]["flops"]
        assert sum(flops["nodes"].values()) == counter.get_total_flops(), method
        assert flops["modules"]["secondary_conv#0"] == 2 * 32 * 16 * 9 * 16 * 16
    # attention: torch counts the CPU kernel as 0 at run time; its formula, on the captured shapes
    q = torch.randn(1, 2, 5, 8)

    class Attn(torch.nn.Module):
        def forward(self, q: Any, k: Any, v: Any) -> Any:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    g = fxviz.capture(Attn(), (q, q, q), method="export")
    assert sum(g.annotations["overlays"]["flops"]["nodes"].values()) == sdpa_flop_count((1, 2, 5, 8), (1, 2, 5, 8),
                                                                                          (1, 2, 5, 8))
    with torch.device("meta"):
        meta_model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    g = fxviz.capture(meta_model, (torch.randn(4, 64, device="meta"),))
    assert g.annotations["overlays"]["flops"]["nodes"] == {"linear": 2 * 4 * 64 * 128, "linear_1": 2 * 4 * 128 * 8}
    assert Graph.from_json(g.to_json()).annotations["overlays"]["flops"] == g.annotations["overlays"]["flops"]



def test_flops_per_module_match_torchs_counter_in_nested_repeated_blocks() -> None:
    """Each module call's FLOPs are those torch's counter gives the module (its ops at any depth),
    also where blocks repeat the same shapes (counts remembered per op and shape) and nest."""
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    import fxviz

    def block(width: int) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.ReLU(),
                                   torch.nn.Sequential(torch.nn.Linear(2 * width, width)))

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[block(8) for _ in range(3)], torch.nn.Sequential(block(8), block(8))).eval()
    args = (torch.randn(5, 8),)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(*args)
    torch_modules = {k.removeprefix("Sequential").lstrip("."): sum(v.values())
                     for k, v in counter.get_flop_counts().items()}
    flops = fxviz.capture(model, args, method="eager").annotations["overlays"]["flops"]
    assert sum(flops["nodes"].values()) == counter.get_total_flops() == 10 * 2 * 5 * 8 * 16
    mine = {k.split("#")[0]: v for k, v in flops["modules"].items()}
    assert mine == {k: v for k, v in torch_modules.items() if k and k != "Global" and v}
    assert mine["3"] == mine["3.0"] + mine["3.1"] == 2 * mine["0"]


# ---- Model Explorer's graph JSON ----------------------------------------------------------------------

#: The fields of Model Explorer's graph JSON (model_explorer/graph_builder.py in the
#: ai-edge-model-explorer package, 0.1.34: Graph, GraphNode, IncomingEdge, MetadataItem, KeyValue,
#: GraphNodeStyle), with their types: what its JSON adapter and `dacite.from_dict(Graph, ...)` load.
ME_GRAPH = {"id": str, "nodes": list, "groupNodeAttributes": dict, "groupNodeConfigs": list,
            "nodeLabelsToHide": list, "tasksData": dict, "layoutConfigs": dict}
ME_NODE = {"id": str, "label": str, "namespace": str, "subgraphIds": list, "attrs": list, "incomingEdges": list,
           "outputsMetadata": list, "inputsMetadata": list, "style": dict, "config": dict}
ME_EDGE = {"sourceNodeId": str, "sourceNodeOutputId": str, "targetNodeInputId": str}
ME_STYLE = {"backgroundColor": str, "borderColor": str, "hoveredBorderColor": str}


def check_fields(d: dict[str, Any], fields: dict[str, type], required: tuple[str, ...]) -> None:
    assert set(d) <= set(fields), set(d) - set(fields)
    assert all(k in d for k in required)
    for k, v in d.items():
        assert isinstance(v, fields[k]), (k, v)


def test_model_explorer_graph_follows_its_documented_schema() -> None:
    g = partial_graph()  # eager, partial: a graph only fxviz can capture
    data = to_model_explorer(g)
    (graph,) = data["graphs"]
    check_fields(graph, ME_GRAPH, ("id", "nodes"))
    ids = set()
    for n in graph["nodes"]:
        check_fields(n, ME_NODE, ("id", "label"))
        for kv in n["attrs"]:
            assert set(kv) == {"key", "value"} and all(isinstance(x, str) for x in kv.values())
        for e in n["incomingEdges"]:
            check_fields(e, ME_EDGE, tuple(ME_EDGE))
            assert e["sourceNodeId"] in ids  # defined before it is read
        for m in n["outputsMetadata"]:
            assert set(m) == {"id", "attrs"}
        if "style" in n:
            check_fields(n["style"], ME_STYLE, ())
        ids.add(n["id"])
    assert all(isinstance(v, dict) and all(isinstance(x, str) for x in v.values())
               for v in graph["groupNodeAttributes"].values())
    by_id = {n["id"]: n for n in graph["nodes"]}
    assert by_id["linear"]["namespace"] == "enc/fc" and by_id["relu"]["namespace"] == "enc"
    assert by_id["linear"]["outputsMetadata"][0]["attrs"][0] == {"key": "tensor_shape", "value": "float32[2,8]"}
    assert "style" in by_id["item"] and {"key": "error", "value": g.node("item").error} in by_id["item"]["attrs"]
    assert graph["groupNodeAttributes"]["enc/fc"]["class"] == "Linear"
    assert "error (the model raised)" in graph["groupNodeAttributes"][""]
    assert {"key": "parameters", "value": "64 params"} in by_id["linear"]["attrs"]  # overlays as attributes


def test_model_explorer_node_data_carries_every_overlay(tmp_path: Path) -> None:
    g = cnn_graph()
    data = node_data(g)
    assert {"params", "bytes", "family"} <= set(data)
    assert data["params"]["results"]["linear"] == {"value": 2048 * 128 + 128}
    assert [s["stop"] for s in data["params"]["gradient"]] == [0, 0.5, 1]
    assert data["family"]["results"]["conv2d"]["value"] == "conv"
    written = write_model_explorer(g, tmp_path / "g.json")
    assert written[0] == tmp_path / "g.json" and (tmp_path / "g.nodedata.params.json") in written
    # a node data file reads back as an fxviz overlay with the same values
    _, spec, _ = read_overlay((tmp_path / "g.nodedata.params.json").read_text(), g, where="g.nodedata.params.json")
    assert spec["nodes"] == overlays(g)["params"]["nodes"]


@pytest.mark.parametrize(("bad", "kind"), [
    (2**63, "number"), (-(2**63), "number"), (True, "number"), (float("inf"), "number"), ("hot", "number"),
    (1.5, "category"), (["mask"], "category"),
])
def test_one_bad_value_among_many_good_ones_is_refused_naming_it(bad: Any, kind: str) -> None:
    # set_overlay checks a whole table at once where every entry is plain (ints, floats or text):
    # a single entry that is not must still be found and named
    good: Any = 1.0 if isinstance(bad, int) and not isinstance(bad, bool) else 7
    good = "mask" if kind == "category" else good
    nodes = {f"n{i}": good for i in range(200)}
    nodes["the_bad_one"] = bad
    with pytest.raises(GraphFormatError, match="the_bad_one"):
        set_overlay(stack_graph(), "x", label="x", kind=kind, nodes=nodes)
    with pytest.raises(GraphFormatError, match="the_bad_one"):
        set_overlay(stack_graph(), "x", label="x", kind=kind, modules=nodes)


def test_plain_tables_keep_their_values_order_and_drop_only_nulls() -> None:
    ints = {f"n{i}": (i * 7919) % 1000 for i in range(300)}
    spec = set_overlay(stack_graph(), "x", label="x", kind="number", nodes=ints, modules={"a": 2**63 - 1, "b": -(2**63 - 1)})
    assert list(spec["nodes"].items()) == list(ints.items()) and spec["nodes"] is not ints
    assert spec["modules"] == {"a": 2**63 - 1, "b": -(2**63 - 1)}
    spec = set_overlay(stack_graph(), "x", label="x", kind="category", nodes={"b": "mask", "a": None, "c": "shape"})
    assert list(spec["nodes"].items()) == [("b", "mask"), ("c", "shape")]
