"""A model nested thousands of modules deep: what fxviz writes grows with the nodes plus the depth,
not with its square (state names and module paths are O(depth) long each)."""

from __future__ import annotations

import json
import sys

import pytest

from fxviz.ir import Graph, ModuleInfo, Node, Ref, TensorMeta
from fxviz.render.html import view_model


def nested(depth: int) -> Graph:
    """A chain of ``depth`` modules (``inner``, ``inner.inner``, ...), each with a weight and an op
    that reads it, as :func:`tests.state_models.deep_nested` captures."""
    nodes = [Node("x", "input", "x", outputs=(TensorMeta((3, 4)),))]
    modules = {"": ModuleInfo("Nested")}
    stack: tuple[tuple[str, int], ...] = ()
    prev = "x"
    for k in range(depth):
        path = stack[-1][0] + ".inner" if stack else "inner"
        stack = (*stack, (path, 0))
        modules[path] = ModuleInfo("Nested")
        w = f"{path}.weight"
        nodes.append(Node(w, "parameter", w, stack=((path, 0),), outputs=(TensorMeta((4, 4)),)))
        nodes.append(Node(f"linear_{k}", "op", "aten.linear.default", (Ref(prev), Ref(w)), stack,
                          (TensorMeta((3, 4)),)))
        prev = f"linear_{k}"
    nodes.append(Node("output", "output", "output", (Ref(prev),)))
    return Graph(name="Nested", nodes=nodes, modules=modules, method="export")


def test_the_report_grows_with_the_nodes_not_with_the_square_of_the_depth() -> None:
    """Every parameter's node was named by its whole state name in the report (12,000 characters
    at a depth of 2,000): 26-38 MB at that depth for 0.59 MB at 200."""
    small, large = (len(json.dumps(view_model(nested(d)))) for d in (100, 800))
    assert large / small < 9, (small, large)  # 8x the nodes and the depth; it was 29x
    data = view_model(nested(800))
    names = data["nodes"]["n"]
    assert len(set(names)) == len(names)  # names cut to a label's length stay unique
    assert names[-2] == "linear_799" and names[-3].endswith(".inner.weight#" + str(len(names) - 3))


def strings(v: object) -> list[str]:
    """Every string in plain JSON data, keys included (iterative)."""
    out, todo = [], [v]
    while todo:
        x = todo.pop()
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, dict):
            out += x
            todo += x.values()
        elif isinstance(x, list):
            todo += x
    return out


def capture_nested(depth: int, method: str) -> Graph:
    import torch

    import fxviz
    from tests.state_models import deep_nested

    torch.manual_seed(0)
    g = fxviz.capture(deep_nested(depth).eval(), (torch.randn(3, 4),), method=method, isolate=False)
    assert not g.notes and g.node("inner." * (depth - 1) + "lin.weight").kind == "parameter", g.notes
    return g


@pytest.mark.parametrize("method", ["fx", "export"])
def test_the_graph_json_grows_with_the_nodes_not_with_the_square_of_the_depth(method: str) -> None:
    """Parameter names and targets (``inner.inner. ... .lin.weight``), fx's op names
    (``inner_inner_lin``), references to them, module paths in ``modules``, ``stacks`` and the
    ``stats`` annotation and of the FLOPs overlay were each written in full, O(depth) characters: 158 MB at a depth of 2,000
    for 1.7 MB at 200. Each long string is now written after an earlier one, and reads back the same."""
    texts, graphs = [], []
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # fx traces 400 modules deep; at the default it leaves them a leaf
    try:
        for depth in (100, 400):
            graphs.append(capture_nested(depth, method))
            texts.append(graphs[-1].to_json())
    finally:
        sys.setrecursionlimit(limit)
    small, large = map(len, texts)
    assert large / small < 4.5, (small, large)  # 4x the nodes and the depth; it was 14x
    assert max(map(len, strings(json.loads(texts[1])))) < 200  # no string grows with the depth
    back = Graph.from_json(texts[1])
    g = graphs[1]  # the same graph (attempts' seconds are rounded when written)
    assert list(back.nodes) == list(g.nodes) and back.modules == g.modules and back.annotations == g.annotations
    assert back.to_json() == texts[1]


def test_shared_prefixes_cannot_expand_a_small_file_into_a_huge_graph(monkeypatch: object) -> None:
    """Each name written after the one before plus a letter: a file linear in the nodes whose
    names are quadratic. The reader stops at a cap on what the prefixes expand to."""
    from fxviz.errors import GraphFormatError
    from fxviz.schema import compact

    pytest.MonkeyPatch.setattr(monkeypatch, compact, "MAX_EXPANDED", 10**6)  # type: ignore[arg-type]
    nodes = [{"name": "a" * 10_000, "kind": "input"}]
    nodes += [{"name": [i, 10_000 + i, "b"], "kind": "input"} for i in range(200)]
    with pytest.raises(GraphFormatError, match="shared prefixes expand to more than 1,000,000 characters"):
        Graph.from_json(json.dumps({"schema": 2, "nodes": nodes}))
    nodes[1:] = nodes[1:50]  # below the cap the same form reads
    assert Graph.from_json(json.dumps({"schema": 2, "nodes": nodes})).nodes[-1].name == "a" * 10_000 + "b" * 49
