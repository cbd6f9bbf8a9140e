"""The terminal tree: golden files on hand-built IR (torch releases rename nodes; hand-built graphs
don't change), fixed width, no colour. Regenerate with FXVIZ_UPDATE_GOLDEN=1 after a deliberate
change, and read the diff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import rich
from rich.console import Console

from fxviz.ir import Graph
from tests.irbuild import cnn_graph, stack_graph

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
    assert text.splitlines()[0].startswith("CoolCNN  captured by fx")
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
