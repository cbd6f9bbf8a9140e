"""The HTML report without a browser: the embedded view-model, escaping, size."""

from __future__ import annotations

import json
import re

import pytest

from fxviz.errors import RenderError
from fxviz.render import html as html_mod
from fxviz.render.html import repr_html, to_html, view_model
from tests.render_graphs import HOSTILE, hostile_graph, partial_graph

if not (html_mod.BUNDLE_DIR / "report.js").is_file():
    pytest.skip("the report bundle is not built: run scripts/build_web.sh", allow_module_level=True)


def embedded(text: str) -> dict:
    m = re.search(r'<script type="application/json" id="fxviz-data">(.*?)</script>', text, re.S)
    assert m is not None
    return json.loads(m.group(1))


def test_embedded_json_round_trips() -> None:
    g = partial_graph()
    text = to_html(g)
    assert embedded(text) == json.loads(json.dumps(view_model(g)))
    data = embedded(text)
    names = [n["n"] for n in data["nodes"]]
    assert names == [n.name for n in g.nodes]
    item = data["nodes"][names.index("item")]
    assert item["e"].startswith("RuntimeError") and data["error"]
    assert [a["method"] for a in data["attempts"]] == ["export", "fx", "eager"]
    assert data["attempts"][0]["reason"] == g.attempts[0].reason()
    linear = data["nodes"][names.index("linear")]
    assert data["metas"][linear["out"][0]] == ["[2, 8]", "float32", "2×8 f32"]
    assert data["groups"][linear["g"]]["path"] == "enc.fc"


def test_hostile_names_cannot_break_out() -> None:
    text = to_html(hostile_graph())
    # the only script tags are the two the template writes
    assert text.lower().count("<script") == 2 and text.lower().count("</script") == 2
    assert "<img" not in text
    data = embedded(text)
    assert data["nodes"][0]["n"] == HOSTILE  # the name survives, as data
    assert data["name"] == f"Evil{HOSTILE}"
    title = re.search(r"<title>(.*?)</title>", text, re.S)
    assert title is not None and "&lt;/script&gt;" in title.group(1)


def test_repr_html_is_an_isolated_iframe() -> None:
    a, b = repr_html(partial_graph()), repr_html(partial_graph())
    assert a.startswith("<iframe") and 'sandbox="allow-scripts' in a
    ids = [re.search(r'id="([^"]+)"', x).group(1) for x in (a, b)]  # type: ignore[union-attr]
    assert ids[0] != ids[1]
    assert "<script" not in a  # all of the report is inside the escaped srcdoc


def test_size_budget() -> None:
    """The fixed part (script, styles, template) stays far under the 1.5 MB budget."""
    text = to_html(partial_graph())
    data = re.search(r'id="fxviz-data">(.*?)</script>', text, re.S).group(1)  # type: ignore[union-attr]
    assert len(text.encode()) - len(data.encode()) < 1_500_000
    assert len(text.encode()) - len(data.encode()) < 200_000  # dagre + app today: ~80 kB


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


def test_unwritable_path(tmp_path) -> None:
    with pytest.raises(RenderError, match="cannot write"):
        to_html(partial_graph(), tmp_path / "missing" / "r.html")
