"""A model nested thousands of modules deep: what fxviz writes grows with the nodes plus the depth,
not with its square (state names and module paths are O(depth) long each)."""

from __future__ import annotations

import json

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
