"""Panels: an analysis's table whose rows point into the graph, set, checked, saved, and drawn by
every renderer (the tree prints it, the view-model indexes its rows)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fxviz.errors import GraphFormatError
from fxviz.ir import Graph
from fxviz.passes.panels import headline, panels, row, set_headline, set_panel
from fxviz.render.html import view_model
from tests.irbuild import stack_graph


def breaks_panel(g: Graph) -> None:
    set_panel(g, "breaks", title="graph breaks", columns=["where", "reason", "count"], rows=[
        row("model.py:12", "Tensor.item()", 3, node="fc_1", module="h.1#0", level="error"),
        row("model.py:40", "print", 1, module="no.such#0"),
        row("total", None, 4.5),  # a number column is right-aligned
    ], note="2 causes")


def test_a_panel_round_trips_through_json_and_points_the_view_model_at_nodes_and_boxes() -> None:
    g = stack_graph(layers=2)
    breaks_panel(g)
    back = Graph.from_json(g.to_json())
    assert panels(back) == panels(g)
    vm = view_model(back)
    (p,) = vm["panels"]
    assert (p["name"], p["title"], p["note"], p["columns"]) == ("breaks", "graph breaks", "2 causes",
                                                                ["where", "reason", "count"])
    first, second, third = p["rows"]
    assert first["c"] == ["model.py:12", "Tensor.item()", "3"] and first["lv"] == "error"
    assert vm["nodes"]["n"][first["n"]] == "fc_1"
    assert vm["groups"][first["g"]]["path"] == "h.1"
    assert "n" not in second and "g" not in second  # a module the graph lacks points nowhere
    assert third["c"] == ["total", "", "4.5"]


def test_the_tree_prints_every_panel_under_the_tree() -> None:
    g = stack_graph(layers=2)
    breaks_panel(g)
    text = str(g)
    tree_end = text.index("graph breaks")
    assert "h.0" in text[:tree_end]  # the tree comes first
    table = text[tree_end:]
    assert "Tensor.item()" in table and "model.py:40" in table and "2 causes" in table
    assert [ln for ln in table.splitlines() if "model.py:12" in ln][0].rstrip().endswith("3 │")


def test_a_panel_without_rows_is_one_line_not_an_empty_table() -> None:
    g = stack_graph(layers=2)
    set_panel(g, "divergence", title="numerics against export", columns=["what", "where"], rows=[],
              note="no value is beyond tolerance")
    tail = str(g).splitlines()[-1]
    assert tail == "numerics against export: no value is beyond tolerance"
    assert "┏" not in str(g)


@pytest.mark.parametrize(("spec", "message"), [
    ({"columns": ["a"], "rows": [{"cells": [1, 2]}]}, r"'rows'\[0\] 'cells': expected 1 cells"),
    ({"columns": ["a"], "rows": [{"cells": [[1]]}]}, "expected text, a number or null"),
    ({"columns": ["a"], "rows": [{"cells": [1], "level": "fatal"}]}, "'level': expected 'error'"),
    ({"columns": [3]}, r"'columns'\[0\]"),
    ({"rows": {}}, "'rows': expected a list"),
    ({"columns": ["a"], "rows": [{"cells": [1], "href": "javascript:alert(1)"}]}, "'href': expected the name of a sibling"),
    ({"columns": ["a"], "rows": [{"cells": [1], "href": "../up.html"}]}, "'href': expected the name of a sibling"),
    ({"columns": ["a"], "rows": [{"cells": [1], "href": "https://x.org/a.html"}]}, "'href'"),
])
def test_a_saved_graph_with_a_malformed_panel_is_refused_naming_it(spec: dict[str, Any], message: str) -> None:
    d = json.loads(stack_graph().to_json())
    d["annotations"]["panels"] = {"mine": spec}
    with pytest.raises(GraphFormatError, match=message):
        Graph.from_dict(d)


def test_set_panel_checks_what_it_writes() -> None:
    with pytest.raises(GraphFormatError, match="cells"):
        set_panel(stack_graph(), "p", title="t", columns=["a", "b"], rows=[row(1)])


def test_a_row_links_to_a_page_beside_the_report() -> None:
    g = stack_graph(layers=2)
    set_panel(g, "stages", title="pass pipeline", columns=["stage"], rows=[row("0 export", href="r.stage-0.html"),
                                                                              row("1 decompose")])
    rows = view_model(Graph.from_json(g.to_json()))["panels"][0]["rows"]
    assert rows[0]["h"] == "r.stage-0.html" and "h" not in rows[1]


def test_the_sort_keys_are_the_numbers_python_wrote_not_their_text() -> None:
    g = stack_graph(layers=2)
    breaks_panel(g)
    rows = view_model(Graph.from_json(g.to_json()))["panels"][0]["rows"]
    assert [r.get("k") for r in rows] == [[None, None, 3], [None, None, 1], [None, None, 4.5]]
    g2 = stack_graph(layers=1)
    set_panel(g2, "t", title="t", columns=["a", "time"], rows=[row("text only", "fast"), row("x", "50.5 ms", sort=[None, 0.0505])])
    first, second = view_model(g2)["panels"][0]["rows"]
    assert "k" not in first and second["k"] == [None, 0.0505]  # a row's own keys: "4.1 s" sorts after "50.5 ms"
    with pytest.raises(GraphFormatError, match="'sort': expected 2 numbers or nulls"):
        set_panel(g2, "t", title="t", columns=["a", "b"], rows=[row("x", "y", sort=[1])])
    with pytest.raises(GraphFormatError, match=r"'sort'\[0\]: expected a number or null"):
        set_panel(g2, "t", title="t", columns=["a"], rows=[row("x", sort=["1"])])


def test_an_analysis_headline_is_saved_checked_and_points_the_view_model_at_its_panel_and_node() -> None:
    g = stack_graph(layers=2)
    assert headline(g) == "" and view_model(g)["analysis"] is None  # a plain capture says nothing here
    breaks_panel(g)
    set_headline(g, "torch.compile: 2 graphs, 1 break (1 cause)", level="warn", panel="breaks", node="fc_1",
                 module="h.1#0")
    back = Graph.from_json(g.to_json())
    assert headline(back) == "torch.compile: 2 graphs, 1 break (1 cause)"
    vm = view_model(back)
    a = vm["analysis"]
    assert (a["text"], a["lv"], a["p"]) == ("torch.compile: 2 graphs, 1 break (1 cause)", "warn", "breaks")
    assert vm["nodes"]["n"][a["n"]] == "fc_1" and vm["groups"][a["g"]]["path"] == "h.1"
    set_headline(g, "no table behind it", panel="no-such-panel")
    assert "p" not in view_model(g)["analysis"]  # a panel the graph lacks is not offered


@pytest.mark.parametrize(("spec", "message"), [
    ({"text": ""}, "'headline' 'text'"),
    ({"text": 3}, "'headline' 'text'"),
    ({"text": "x", "level": "fatal"}, "'headline' 'level'"),
    ({"text": "x", "node": 5}, "'headline' 'node'"),
])
def test_a_malformed_headline_is_refused_naming_it(spec: dict[str, Any], message: str) -> None:
    d = json.loads(stack_graph().to_json())
    d["annotations"]["headline"] = spec
    with pytest.raises(GraphFormatError, match=message):
        Graph.from_dict(d)
