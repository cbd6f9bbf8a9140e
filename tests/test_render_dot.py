"""The static exports: DOT structure (clusters, labels, folded runs) and images on disk."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("pygraphviz")
torch = pytest.importorskip("torch")

import fxviz  # noqa: E402
from fxviz import examples  # noqa: E402
from fxviz.errors import RenderError  # noqa: E402
from fxviz.render.dot import to_dot, write_image  # noqa: E402
from tests.render_graphs import HOSTILE, hostile_graph, partial_graph  # noqa: E402


@pytest.fixture(scope="module")
def cnn() -> fxviz.Graph:
    m, a = examples.cnn()
    return fxviz.capture(m, a)


@pytest.fixture(scope="module")
def transformer() -> fxviz.Graph:
    m, a = examples.transformer()
    return fxviz.capture(m, a)


def cluster_labels(dot: str) -> list[str]:
    return re.findall(r"subgraph cluster_\d+ \{\s*graph \[[^\]]*?label=\"?([^\",\n]+)", dot)


def test_cnn_modules_are_clusters_with_params_and_shapes(cnn: fxviz.Graph) -> None:
    dot = to_dot(cnn)
    labels = cluster_labels(dot)
    for want in ("initial_conv (Conv2d)", "parallel_conv (Conv2d)", "fully_connected1 (Linear)"):
        assert want in labels
    # the shared max_pool is one cluster per call, so the two branches stay apart
    assert {"max_pool (MaxPool2d)", "max_pool (MaxPool2d) #2", "max_pool (MaxPool2d) #3"} <= set(labels)
    assert '"ninitial_conv.weight"' in dot  # parameters are nodes of their own
    assert "label=\"1×16×32×32 f32\"" in dot  # edges carry shapes
    assert "captured with export" in dot


def test_depth_collapses_deeper_modules(transformer: fxviz.Graph) -> None:
    top = to_dot(transformer, depth=0)
    assert cluster_labels(top) == []
    assert "blocks.0-1 ×2" in top and "shape=box3d" in top  # the folded run is one box
    d2 = to_dot(transformer, depth=2)
    labels = cluster_labels(d2)
    assert "blocks.0-1 ×2 Block" in labels
    assert "blocks.0 (Block)" in labels and "blocks.1 (Block)" not in labels  # drawn once
    assert "attn (Attention)" in d2 and not any(lb.startswith("attn") for lb in labels)
    full = to_dot(transformer)
    assert "attn (Attention)" in cluster_labels(full)
    # the run is drawn through its first member: half the linear ops of the unfolded model
    assert full.count("label=linear") < sum(1 for n in transformer.ops if n.target.endswith("linear.default"))


def test_partial_graph_marks_the_failing_node() -> None:
    dot = to_dot(partial_graph())
    # the title says the model raised, not that a capture method merely produced the graph
    assert "the model raised during the eager capture" in dot and "captured with" not in dot
    item = re.search(r"nitem\s*\[([^\]]*)\]", dot)
    assert item is not None and "#c62828" in item.group(1)


def test_hostile_names_stay_text() -> None:
    dot = to_dot(hostile_graph())
    assert HOSTILE in dot  # quoted as a string, not parsed as an HTML label


@pytest.mark.parametrize(("fmt", "magic"), [("svg", b"<?xml"), ("png", b"\x89PNG"), ("pdf", b"%PDF"), ("dot", b"digraph")])
def test_write_image(cnn: fxviz.Graph, tmp_path: Path, fmt: str, magic: bytes) -> None:
    out = write_image(cnn, tmp_path / f"cnn.{fmt}", depth=1)
    data = out.read_bytes()
    assert len(data) > 500
    assert data.lstrip().startswith(magic) or (fmt == "svg" and b"<svg" in data[:400])


def test_write_image_unknown_format(cnn: fxviz.Graph, tmp_path: Path) -> None:
    with pytest.raises(RenderError, match="image format"):
        write_image(cnn, tmp_path / "cnn.bmp3")


def test_missing_pygraphviz_names_the_fix(cnn: fxviz.Graph, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pygraphviz", None)
    with pytest.raises(RenderError, match='to_svg needs pygraphviz and the Graphviz library: see README "Install"'):
        write_image(cnn, "unused.svg")


def test_a_caches_outputs_and_each_modules_plumbing_are_one_box() -> None:
    from tests.test_plumbing import masked_attention
    from tests.test_tree import decoder_graph

    dot = to_dot(decoder_graph())
    assert "past_key_values\\n6 outputs" in dot and "tooltip=\"past_key_values" not in dot
    assert dot.count("shape=oval") == 3  # hidden, logits, and one for the whole cache
    plain = to_dot(masked_attention())
    assert re.search(r"label=\"15 plumbing ops \(mask, position, shape, alias, assert, detach\)\"", plain)
    assert "label=arange" not in plain and "label=le" not in plain
    shown = to_dot(masked_attention(), plumbing=True)
    assert "label=arange" in shown and "plumbing ops" not in shown
