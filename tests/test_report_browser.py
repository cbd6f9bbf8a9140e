"""The report's promises, measured in the page (headless Chromium): the first view is legible
(every label at least 10 px on screen, the model's top level whole on screen, inputs above
outputs), a toggle moves nothing inside the other open boxes and costs the same however much is
open, a link reopens the same view, overlays colour the right nodes, anything draws (a chain of
20,000 ops, 5,000 nested calls), expand-all, Fit and the overview work, and a notebook's frame
refits when it gets its size. Timings are measured in bench/report.py, not asserted here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import fxviz
from fxviz import examples
from fxviz.ir import Graph
from fxviz.render.html import repr_html
from tests.irbuild import GraphBuilder, stack_graph
from tests.report_browser import ARTIFACTS, ReportPage, page_from_data
from tests.report_models import gpt2_small_graph, llama_80_graph, t5_small_graph
from tests.viewmodel import node_rows

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("bundle")]


@pytest.fixture(scope="module")
def cnn() -> Graph:
    m, a = examples.cnn()
    return fxviz.capture(m, a)


@pytest.fixture(scope="module")
def gpt2() -> Graph:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2Model(transformers.GPT2Config(n_layer=2)).eval()
    return fxviz.capture(model, (), {"input_ids": torch.randint(0, 1000, (1, 16))})


@pytest.fixture
def pages(browser: Any, tmp_path: Path) -> Iterator[Any]:
    """Open a graph's report (optionally with its view-model edited); every page opened is
    checked for errors and network when the test ends."""
    opened: list[ReportPage] = []

    def open_(graph: Graph, name: str, edit: Any = None, **kw: Any) -> ReportPage:
        r = ReportPage(browser, page_from_data(graph, tmp_path / f"{name}.html", edit), **kw)
        opened.append(r)
        return r

    yield open_
    for r in opened:
        r.close()


def top_level_on_screen(r: ReportPage) -> None:
    """Every item of the model's own level lies whole inside the graph's area, inputs above
    outputs: the first view shows the top-level structure and its path top to bottom."""
    area = r.page.locator("[data-ref=svg]").bounding_box()
    rects = r.rects()
    top = r.page.evaluate("fxvizReport.model.items(-1)")
    for key in top:
        x, y, w, h = rects[key]
        assert area["x"] - 0.5 <= x and x + w <= area["x"] + area["width"] + 0.5, key
        assert area["y"] - 0.5 <= y and y + h <= area["y"] + area["height"] + 0.5, key
    kinds = r.page.evaluate("fxvizReport.model.items(-1).map(k => k[0] === 'n' ? fxvizReport.model.nodeKind(+k.slice(1)) : '')")
    ins = [rects[k][1] for k, kind in zip(top, kinds, strict=True) if kind == "input"]
    outs = [rects[k][1] for k, kind in zip(top, kinds, strict=True) if kind == "output"]
    assert ins and outs and max(ins) < min(outs)


# ---- a legible first view -------------------------------------------------------------------------


def test_first_view_of_the_cnn_is_legible(pages: Any, cnn: Graph) -> None:
    r = pages(cnn, "cnn", width=1600, height=1000)
    sizes = r.label_sizes()
    assert sizes["count"] > 20 and sizes["min"] >= 10, sizes
    top_level_on_screen(r)
    # the two branches, as in the user's sketch: both convs side by side under x
    rects = r.rects()
    conv = [rects[r.page.get_attribute(f'.fx-box[data-path="{p}"]', "data-key") or ""] for p in ("initial_conv", "parallel_conv")]
    assert abs(conv[0][1] - conv[1][1]) < 1
    r.shot("first-view-cnn")


@pytest.fixture(scope="module")
def big_models() -> dict[str, Graph]:
    return {"gpt2-small": gpt2_small_graph(), "t5-small": t5_small_graph(), "llama-80": llama_80_graph()}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2-small", "t5-small", "llama-80"])
def test_first_view_is_legible_at_1600x1000(pages: Any, big_models: dict[str, Graph], name: str) -> None:
    r = pages(big_models[name], name, width=1600, height=1000)
    sizes = r.label_sizes()
    assert sizes["count"] > 8 and sizes["min"] >= 10, sizes
    top_level_on_screen(r)
    # repeated blocks are one box
    runs = r.page.eval_on_selector_all(".fx-run", "els => els.map(e => e.textContent)")
    assert all("×" in t for t in runs)
    r.shot(f"first-view-{name}")


# ---- stable, cheap toggles ------------------------------------------------------------------------


RELATIVE = """(toggled) => {
  // every drawn item's rectangle relative to the frame of each open box around it, for the
  // open boxes that are neither the toggled box nor around it
  const skip = new Set();
  for (let g = toggled; g >= 0; g = fxvizReport.model.gp[g]) skip.add('g' + g);
  const out = {};
  for (const c of document.querySelectorAll('[data-ref=viewport] .fx-cluster')) {
    if (skip.has(c.dataset.key)) continue;
    const f = c.querySelector(':scope > .fx-frame').getBoundingClientRect();
    for (const e of c.querySelectorAll('.fx-leaf, .fx-cluster')) {
      const r = (e.classList.contains('fx-cluster') ? e.querySelector(':scope > .fx-frame') : e.querySelector('rect:not(.fx-stack)')).getBoundingClientRect();
      out[c.dataset.key + ' ' + e.dataset.key] = [r.x - f.x, r.y - f.y, r.width, r.height].map(v => Math.round(v * 10) / 10);
    }
  }
  return out;
}"""


def test_a_toggle_moves_nothing_inside_other_open_boxes(pages: Any, gpt2: Graph) -> None:
    """The property: opening or closing box T leaves every item inside every other open box B
    (B neither T nor around T) at the same place relative to B's frame, and T's top-left corner
    where it was on screen, unless T would then reach past the screen's edge: then the view
    pans (never zooms) just enough to bring T in (T on screen before; one off screen leaves the
    view alone); in the boxes around T, items keep their order top to bottom."""
    r = pages(gpt2, "gpt2-stable", width=1600, height=1000)
    path = {p: r.page.evaluate(f"fxvizReport.model.groups.findIndex(g => g.path === '{p}')") for p in
            ("h.0", "h.1", "h.0.attn", "h.1.attn", "h.1.mlp")}
    r.js(f"fxvizReport.viewer.setOpen([{path['h.0.attn']}, {path['h.1.mlp']}])")
    toggled = path["h.1.attn"]
    r.js(f"fxvizReport.viewer.go('g{toggled}')")  # on screen, as a box double-clicked is
    before = r.page.evaluate(RELATIVE, toggled)
    assert len(before) > 20
    assert {f"g{path['h.0']}", f"g{path['h.1.mlp']}"} <= {k.split()[0] for k in before}
    box_of = f'[data-ref=viewport] [data-key="g{toggled}"]'
    corner = f"() => {{ const e = document.querySelector('{box_of} > rect:not(.fx-stack)'); const b = e.getBBox(), m = e.getScreenCTM(); return [m.e + b.x * m.a, m.f + b.y * m.d]; }}"
    at = r.page.evaluate(corner)
    order = "key => [...document.querySelector(`[data-key=\"${key}\"]`).querySelectorAll(':scope > .fx-kids > *, :scope > .fx-leaves > .fx-leaf')].sort((a, b) => a.getBoundingClientRect().y - b.getBoundingClientRect().y).map(e => e.dataset.key)"
    order_before = r.page.evaluate(order, f"g{path['h.1']}")
    area = r.page.locator("[data-ref=svg]").bounding_box()
    moved_view = 0
    for _ in range(2):  # open, then close again
        r.dblclick(box_of)
        after = r.page.evaluate(RELATIVE, toggled)
        # each item's place relative to its box, to a pixel's fraction (a box that moved by a
        # fraction of a pixel rounds its items' relative places either way)
        moved = {k: (before[k], v) for k, v in after.items() if k in before
                 and any(abs(a - b) > 0.25 for a, b in zip(before[k], v, strict=True))}
        assert not moved and before.keys() <= after.keys(), moved
        now = r.page.evaluate(corner)
        _, _, w, h = r.rects()[f"g{toggled}"]
        if at[0] + w <= area["x"] + area["width"] and at[1] + h <= area["y"] + area["height"]:
            assert abs(now[0] - at[0]) < 0.3 and abs(now[1] - at[1]) < 0.3, (now, at)
        else:  # brought in: across whole (it fits), its top on screen
            assert area["x"] <= now[0] and now[0] + w <= area["x"] + area["width"], (now, w, area)
            assert area["y"] <= now[1] < area["y"] + area["height"] / 2, (now, h, area)
            moved_view += 1
        at = now
        assert r.page.evaluate(order, f"g{path['h.1']}") == order_before
    assert moved_view == 1  # T opened reaches past the screen's bottom
    r.shot("gpt2-stable")


@pytest.fixture(scope="module")
def gpt2_48() -> Graph:
    return gpt2_small_graph(layers=48)


@pytest.mark.slow
def test_toggle_cost_stays_flat_as_blocks_open(pages: Any, gpt2_48: Graph) -> None:
    """On the 48-layer GPT-2, opening the 48th block lays out as many items as opening the 2nd:
    the work of a toggle does not grow with what is already open. Time is bench/report.py's to
    measure: a ratio of browser timings failed here on a loaded 2-core machine (750 ms against
    250 ms) with the same item counts."""
    r = pages(gpt2_48, "gpt2-48-flat", width=1600, height=1000)
    r.js("fxvizReport.viewer.go('g' + fxvizReport.model.groups.findIndex(g => g.run))")
    r.dblclick(".fx-box.fx-run")
    r.dblclick(".fx-box.fx-k-more")
    blocks = r.page.evaluate("fxvizReport.model.groups.flatMap((g, i) => /^transformer\\.h\\.\\d+$/.test(g.path) && !g.run ? [i] : [])")
    assert len(blocks) == 48
    items = []
    for g in blocks:
        n = r.page.evaluate("performance.getEntriesByName('fxviz:expand').length")
        r.page.locator(f'[data-ref=viewport] [data-key="g{g}"]').dispatch_event("dblclick")
        r.page.wait_for_function(f"performance.getEntriesByName('fxviz:expand').length > {n}")
        r.settle()
        items.append(r.page.evaluate("fxvizReport.viewer.engine.last.items"))
    assert r.page.locator(".fx-cluster").count() >= 48
    inner = items[2:-1]  # the blocks inside the ⋯ box
    assert max(inner) == min(inner), items
    r.page.click("[data-action=fit]")
    r.shot("gpt2-48-all-open")


# ---- links, overlays, expand-all, overview -------------------------------------------------------------


def test_a_link_reopens_the_same_view(pages: Any, gpt2: Graph, browser: Any, tmp_path: Path) -> None:
    r = pages(gpt2, "gpt2-link")
    target = next(n for n in gpt2.ops if n.module == "h.1.mlp.c_fc")
    r.js(f"fxvizReport.viewer.go('n' + fxvizReport.model.nodeIndex('{target.name}'))")
    r.page.wait_for_function("location.hash.includes('sel=')")
    url = r.page.url
    opened, selected = r.open_paths(), r.page.get_attribute(".fx-details-body", "data-key")
    assert "h.1.mlp.c_fc" in opened
    again = ReportPage(browser, tmp_path / "gpt2-link.html", hash="#" + url.split("#", 1)[1])
    try:
        assert again.open_paths() == opened
        assert again.page.get_attribute(".fx-details-body", "data-key") == selected
        assert again.page.locator(f'.fx-node.fx-selected[data-name="{target.name}"]').count() == 1
    finally:
        again.close()


FAMILY_COLOURS = {"conv": "#0072b2", "activation": "#e69f00", "pool": "#009e73", "linear": "#cc79a7",
                  "elementwise": "#56b4e9", "shape": "#d55e00"}


def add_overlays(data: dict[str, Any]) -> None:
    """Two overlays in the view-model's contract (WAVE2.md §2): parameters per node and box (a
    number, log scale), and the op family (a category with its colours)."""
    nodes, groups = node_rows(data), data["groups"]
    params = [n.get("np") for n in nodes]
    data["overlays"] = [
        {"name": "params", "label": "parameters", "kind": "number", "unit": "", "scale": "log",
         "min": min(p for p in params if p), "max": max(p for p in params if p), "categories": None,
         "description": "parameters held or read", "nodes": params, "groups": [g["params"] or None for g in groups]},
        {"name": "family", "label": "op family", "kind": "category", "unit": "", "scale": "linear", "min": None,
         "max": None, "categories": {k: {"label": k, "color": c} for k, c in FAMILY_COLOURS.items()},
         "description": "", "nodes": [n["o"] if n["k"] == "op" else None for n in nodes], "groups": [None] * len(groups)},
    ]
    data["overlay"] = "family"


def rgb(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def test_an_overlay_colours_the_right_nodes(pages: Any, cnn: Graph) -> None:
    r = pages(cnn, "cnn-overlay", add_overlays, width=1600, height=1000)
    r.js("fxvizReport.viewer.expandAll()")
    fills = r.page.eval_on_selector_all(".fx-node", "els => els.map(e => [e.dataset.name, getComputedStyle(e.querySelector('rect')).fill, e.classList.contains('fx-novalue')])")
    family = {n.name: fxviz.render.view.op_kind(n) for n in cnn.nodes}
    for name, fill, none in fills:
        if cnn.node(name).kind == "op":
            assert fill == rgb(FAMILY_COLOURS[family[name]]) and not none, name
        else:
            assert none, name  # no value: muted and dashed, not a category's colour
    legend = r.page.text_content("[data-ref=legend]") or ""
    assert "op family" in legend and "conv" in legend and "pool" in legend
    r.shot("overlay-family")
    # the number overlay: boxes and parameters coloured on a log scale, the value in the details
    r.page.select_option("[data-ref=overlay]", "params")
    r.settle()
    assert "parameters (log)" in (r.page.text_content("[data-ref=legend]") or "")
    weight = r.page.locator('.fx-node[data-name="fully_connected1.weight"]')
    assert "fx-novalue" not in (weight.get_attribute("class") or "")
    assert r.page.locator('.fx-node[data-name="relu"]').get_attribute("class").count("fx-novalue") == 1  # type: ignore[union-attr]
    r.js("fxvizReport.viewer.go('n' + fxvizReport.model.nodeIndex('fully_connected1.weight'))")
    values = r.page.eval_on_selector_all("[data-ref=details] .fx-ov-value", "els => Object.fromEntries(els.map(e => [e.dataset.overlay, e.textContent]))")
    assert values == {"params": "262 k"}  # a parameter has no op family
    r.page.click("[data-ref=scale]")
    r.settle()
    assert "parameters (linear)" in (r.page.text_content("[data-ref=legend]") or "")
    assert "ov=params" in r.page.evaluate("new Promise(f => setTimeout(() => f(location.hash), 300))")
    r.shot("overlay-params")


def test_expand_all_fit_and_the_overview(pages: Any, gpt2: Graph) -> None:
    r = pages(gpt2, "gpt2-all", width=1600, height=1000)
    r.page.click("[data-action=expand]")
    r.settle()
    assert r.page.locator(".fx-node").count() == len(gpt2.nodes)  # everything drawn
    # Fit shows the whole drawing, however small that makes it
    r.page.click("[data-action=fit]")
    area = r.page.locator("[data-ref=svg]").bounding_box()
    whole = r.page.locator("[data-ref=viewport] > .fx-level").bounding_box()
    assert whole["x"] >= area["x"] - 1 and whole["y"] >= area["y"] - 1
    assert whole["x"] + whole["width"] <= area["x"] + area["width"] + 1 and whole["y"] + whole["height"] <= area["y"] + area["height"] + 1
    r.shot("gpt2-all-open")
    # the overview moves the view where it is clicked
    before = r.page.evaluate("fxvizReport.viewer.pz.x + ',' + fxvizReport.viewer.pz.y")
    r.page.locator("[data-ref=minimap]").click(position={"x": 20, "y": 20})
    assert r.page.evaluate("fxvizReport.viewer.pz.x + ',' + fxvizReport.viewer.pz.y") != before
    r.page.click("[data-action=collapse]")
    r.settle()
    assert r.page.locator(".fx-cluster").count() == 0


# ---- nothing too long or too deep -------------------------------------------------------------------


def chain_graph(n: int) -> Graph:
    b = GraphBuilder("Chain")
    x = b.input("x", (8,))
    for i in range(n):
        x = b.op(f"op{i}", "aten.add.Tensor", [x], (8,))
    b.output("output", x)
    return b.build()


def test_a_chain_of_20000_ops_draws_and_navigates(pages: Any) -> None:
    r = pages(chain_graph(20_000), "chain-20000", width=1600, height=1000)
    assert r.keys() >= {"n0", "n1"}  # x and the first op, around a ⋯ box
    more = r.page.locator(".fx-box.fx-k-more")
    assert more.count() == 1 and "⋯ 19,998 more" in (more.text_content() or "")
    r.page.fill("[data-ref=search]", "op12345")
    r.page.wait_for_selector(".fx-results li[data-key]")
    r.page.press("[data-ref=search]", "Enter")
    r.settle()
    assert r.page.locator('.fx-node.fx-selected[data-name="op12345"]').count() == 1
    assert r.page.locator(".fx-leaf").count() < 400
    r.shot("chain-20000")


def test_5000_nested_calls_are_capped_with_a_marker(pages: Any) -> None:
    g = stack_graph()
    deep = tuple((f"m{i}", 0) for i in range(4999))
    g.node("ln_0").stack = deep
    g.validate()
    r = pages(Graph.from_json(g.to_json()), "deep-5000", width=1600, height=1000)
    r.js("fxvizReport.viewer.go('n' + fxvizReport.model.nodeIndex('ln_0'))")
    capped = r.page.locator(".fx-box.fx-selected")
    assert capped.count() == 1 and "levels deeper" in (capped.text_content() or "")
    assert r.page.locator(".fx-cluster").count() == 48
    # the details are those of the op asked for, and the page says where it is
    assert r.details()["name"] == "ln_0"
    assert "nested deeper than the drawing goes" in (r.page.text_content("[data-ref=status]") or "")
    r.js(f"fxvizReport.viewer.go('{capped.get_attribute('data-key')}')")
    assert "nest at most 48 deep" in (r.page.text_content("[data-ref=details]") or "")
    r.shot("deep-5000")


# ---- the notebook's frame ---------------------------------------------------------------------------


def test_the_notebook_frame_refits_when_it_gets_its_size(browser: Any, cnn: Graph, tmp_path: Path) -> None:
    """A notebook lays the output's frame out after the report started: the report fits again
    when the frame gets its size (not at scale 0.05), and the model's name is not cut."""
    host = tmp_path / "notebook.html"
    host.write_text(f'<!doctype html><html><body><div id="cell" style="width:0;overflow:hidden">{repr_html(cnn)}</div></body></html>',
                    encoding="utf-8")
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.goto(host.as_uri())
    frame = page.frames[1]
    frame.wait_for_selector("#fxviz-app[data-ready=true]", state="attached", timeout=30_000)
    page.evaluate("document.getElementById('cell').style.width = '900px'")
    frame.wait_for_function("document.querySelector('[data-ref=svg]').getBoundingClientRect().width > 300", timeout=10_000)
    frame.wait_for_function("fxvizReport.viewer.fitted", timeout=10_000)
    k = frame.evaluate("fxvizReport.viewer.pz.k")
    area = frame.locator("[data-ref=svg]").bounding_box()
    whole = frame.locator("[data-ref=viewport] > .fx-level").bounding_box()
    # fitted to the frame's real size: whole across, at a readable zoom
    assert area["width"] > 300 and whole["width"] <= area["width"] + 1 and k >= 0.9, (k, area, whole)
    name = frame.locator(".fx-model")
    assert name.text_content() == "CoolCNN"
    assert frame.evaluate("(() => { const e = document.querySelector('.fx-model'); return e.scrollWidth <= e.clientWidth + 1 && e.getBoundingClientRect().right <= document.documentElement.clientWidth; })()")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report-notebook-frame.png"))
    page.close()
    assert errors == []


def test_an_analysis_panel_lists_its_findings_and_a_row_selects_its_node(pages: Any, cnn: Graph) -> None:
    """A panel (fxviz.passes.panels) is a table in the drawer under the graph, behind a tab that
    names it and counts its rows: its title, columns, cells and note as Python wrote them, a row's
    level as its colour, and a click on a row selects the node or box it points at."""
    from fxviz.passes.panels import row, set_panel

    g = Graph.from_json(cnn.to_json())
    op = g.ops[3]
    call = next(c for c in g.calls.walk() if c.stack)
    set_panel(g, "breaks", title="graph breaks", columns=["where", "reason", "count"], rows=[
        row("model.py:12", "Tensor.item()", 3, node=op.name, level="error"),
        row("model.py:40", "print", 1, module=call.id, level="warn"),
        row("total", "", 4, href="other-stage.html"),
    ], note="2 causes")
    r = pages(g, "cnn-findings", width=1600, height=1000)
    panel = r.page.locator("[data-ref=findings] [data-panel=breaks]")
    assert panel.is_hidden()  # the drawer starts closed: the graph keeps its room
    r.page.locator("[data-ref=drawerBar] .fx-drawer-tab[data-panel=breaks]", has_text="graph breaks (3)").click()
    assert panel.is_visible()
    assert panel.locator("h2").text_content() == "graph breaks"
    assert panel.locator("th").all_text_contents() == ["where", "reason", "count"]
    cells = panel.locator("tbody tr").evaluate_all("rows => rows.map(r => [...r.cells].map(c => c.textContent))")
    assert cells == [["model.py:12", "Tensor.item()", "3"], ["model.py:40", "print", "1"], ["total", "", "4"]]
    assert "2 causes" in (panel.text_content() or "")
    error_row = panel.locator("tbody tr").nth(0)
    assert "fx-lv-error" in (error_row.get_attribute("class") or "")
    assert panel.locator("tbody tr").nth(2).get_attribute("tabindex") is None  # points at no node
    link = panel.locator("tbody tr").nth(2).locator("a")
    assert (link.get_attribute("href"), link.text_content()) == ("other-stage.html", "total")
    error_row.click()
    r.settle()
    assert r.details()["name"] == op.name
    panel.locator("tbody tr").nth(1).click()
    r.settle()
    assert r.details()["module"] == call.path
