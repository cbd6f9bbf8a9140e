"""Finding one's way in a real model's report (GPT-2 small, 1600x1000, headless Chromium), as a
new user tries it (issue 19, points 7-9): search rows of the twelve repeated blocks say which
block each is and Enter closes the list; Expand all keeps a readable zoom on what was in view
and the sidebar's module tree follows what is open; opening the folded run keeps it in view."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fxviz.ir import Graph
from tests.report_browser import ReportPage, page_from_data
from tests.report_models import gpt2_small_graph

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("bundle")]

BLOCKS = [f"transformer.h.{i}" for i in range(12)]


@pytest.fixture(scope="module")
def gpt2_small() -> Graph:
    return gpt2_small_graph()


@pytest.fixture(scope="module")
def gpt2_page(gpt2_small: Graph, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return page_from_data(gpt2_small, tmp_path_factory.mktemp("nav") / "gpt2-small.html")


@pytest.fixture
def report(browser: Any, gpt2_page: Path) -> Iterator[ReportPage]:
    r = ReportPage(browser, gpt2_page, width=1600, height=1000)
    yield r
    r.close()


def area(r: ReportPage) -> dict[str, float]:
    box = r.page.locator("[data-ref=svg]").bounding_box()
    assert box is not None
    return box


def frame(r: ReportPage, path: str) -> list[float]:
    """Screen rectangle [x, y, w, h] of the drawn box of module `path` (open or closed)."""
    key = r.page.evaluate(f"'g' + fxvizReport.model.groups.findIndex(g => g.path === '{path}' && !g.run)")
    return r.rects()[key]


def tree_open(r: ReportPage) -> set[str]:
    """Paths of the module tree's entries that are unfolded and shown (every fold around them open)."""
    return set(r.page.eval_on_selector_all(
        "[data-ref=tree] details[open] > summary > .fx-tree-label",
        "els => els.filter(e => e.checkVisibility()).map(e => e.dataset.path)"))


def test_search_rows_name_each_repeated_layer_and_enter_closes_the_list(report: ReportPage, gpt2_small: Graph) -> None:
    r = report
    r.page.fill("[data-ref=search]", "c_attn")
    r.page.wait_for_selector(".fx-results li[data-key]")
    rows = r.page.eval_on_selector_all(
        ".fx-results li[data-key]", "els => els.map(e => [e.dataset.key, e.textContent])")
    paths = r.page.evaluate("Object.fromEntries(fxvizReport.model.groups.map((g, i) => ['g' + i, g.path]))")
    boxes = [(key, text) for key, text in rows if key in paths]
    # one row per c_attn module of the graph, each naming its block, no two alike
    wanted = sorted(m for m in gpt2_small.modules if m.endswith(".attn.c_attn"))
    assert len(wanted) == 12
    assert sorted(paths[key] for key, _ in boxes) == wanted
    assert all(paths[key] in text for key, text in boxes), boxes
    assert len({text for _, text in boxes}) == 12
    # Enter goes to the first hit and closes the list; Enter again steps on, Shift+Enter back
    listed = [key for key, _ in rows]
    results = r.page.locator("[data-ref=results]")
    r.page.press("[data-ref=search]", "Enter")
    r.settle()
    assert results.is_hidden()
    assert r.page.get_attribute(".fx-details-body", "data-key") == listed[0]
    assert (r.page.text_content("[data-ref=count]") or "").startswith("1 / ")
    r.page.press("[data-ref=search]", "Enter")
    r.settle()
    assert results.is_hidden() and r.page.get_attribute(".fx-details-body", "data-key") == listed[1]
    r.page.press("[data-ref=search]", "Shift+Enter")
    r.settle()
    assert results.is_hidden() and r.page.get_attribute(".fx-details-body", "data-key") == listed[0]
    # the arrow opens the list again
    r.page.press("[data-ref=search]", "ArrowDown")
    assert results.is_visible()


def readable_and_on(r: ReportPage, path: str) -> None:
    """Every label on screen is at least 10 px high, and box `path` is (at least partly) on screen."""
    sizes = r.label_sizes()
    assert sizes["count"] > 8 and sizes["min"] >= 10, sizes
    a = area(r)
    x, y, w, h = frame(r, path)
    assert x < a["x"] + a["width"] and x + w > a["x"] and y < a["y"] + a["height"] and y + h > a["y"], (path, [x, y, w, h], a)


def test_expand_all_keeps_a_readable_zoom_on_the_view_and_the_tree_follows(report: ReportPage) -> None:
    r = report
    # the first view: the folded run is in the middle of the screen, its blocks closed in the tree
    assert not set(BLOCKS) & tree_open(r)
    r.page.click("[data-action=expand]")
    r.settle()
    assert r.page.locator(".fx-node").count() == r.page.evaluate("fxvizReport.model.count")  # everything drawn
    readable_and_on(r, "transformer.h.0")  # where the run begins
    r.shot("nav-expand-all")
    # the tree shows what is open: every block, and the attention and MLP inside each
    shown = tree_open(r)
    assert {*BLOCKS, *(f"{b}.attn" for b in BLOCKS), *(f"{b}.mlp" for b in BLOCKS)} <= shown, sorted(shown)
    # Collapse all folds the tree again
    r.page.click("[data-action=collapse]")
    r.settle()
    assert not set(BLOCKS) & tree_open(r)


def test_expand_all_stays_on_the_selection(report: ReportPage) -> None:
    r = report
    r.js("fxvizReport.viewer.go('g' + fxvizReport.model.groups.findIndex(g => g.path === 'transformer.h.7.mlp'))")
    r.page.click("[data-action=expand]")
    r.settle()
    readable_and_on(r, "transformer.h.7.mlp")
    a = area(r)
    x, y, w, h = frame(r, "transformer.h.7.mlp")
    # the whole MLP across, its top on screen
    assert a["x"] <= x and x + w <= a["x"] + a["width"] and a["y"] <= y < a["y"] + a["height"] / 2, ([x, y, w, h], a)


def test_opening_the_folded_run_keeps_it_in_view(report: ReportPage) -> None:
    r = report
    # the run near the right edge of the view, as after panning there
    a = area(r)
    run = r.page.evaluate("'g' + fxvizReport.model.groups.findIndex(g => g.run)")
    x, y, w, h = r.rects()[run]
    r.js(f"fxvizReport.viewer.pz.panBy({a['x'] + a['width'] - 120 - x}, 0)")
    r.dblclick(".fx-box.fx-run")
    x, y, w, h = r.rects()[run]
    assert r.page.locator(f'.fx-cluster[data-key="{run}"]').count() == 1
    # the open run lies whole across the view (it fits at a readable zoom), its top on screen
    assert a["x"] - 0.5 <= x and x + w <= a["x"] + a["width"] + 0.5, ([x, y, w, h], a)
    assert a["y"] - 0.5 <= y < a["y"] + a["height"] / 2, ([x, y, w, h], a)
    assert r.label_sizes()["min"] >= 10
    readable_and_on(r, "transformer.h.0")
    # its twelve blocks are listed in the tree
    assert set(BLOCKS) <= {p for p in r.page.eval_on_selector_all(
        "[data-ref=tree] .fx-tree-label", "els => els.filter(e => e.checkVisibility()).map(e => e.dataset.path)")}
    # closed again, the box stays on screen
    r.page.locator(f'.fx-cluster[data-key="{run}"]').first.dispatch_event("dblclick")
    r.settle()
    x, y, w, h = r.rects()[run]
    assert a["x"] <= x and x + w <= a["x"] + a["width"] and a["y"] <= y and y + h <= a["y"] + a["height"]


def test_a_search_jump_asks_the_page_for_no_layout_and_flashes_the_hit(report: ReportPage) -> None:
    """Reading a size or box from the page in the middle of a jump lays the whole page out there,
    then again for the frame (the jump on the 48-layer GPT-2 laid the page out twice)."""
    r = report
    r.page.evaluate("""() => {
      window.fxReads = null;
      for (const [proto, name] of [[SVGGraphicsElement.prototype, 'getBBox'], [Element.prototype, 'getBoundingClientRect']]) {
        const read = proto[name];
        proto[name] = function (...args) {
          if (window.fxReads) window.fxReads.push(`${name} ${(this.dataset && this.dataset.key) || this.tagName}`);
          return read.apply(this, args);
        };
      }
    }""")
    r.page.fill("[data-ref=search]", "c_attn")
    r.page.wait_for_selector(".fx-results li[data-key]")
    r.page.press("[data-ref=search]", "Enter")  # the first jump: the view's size is read once, then kept
    r.settle()
    r.page.evaluate("window.fxReads = []")
    r.page.press("[data-ref=search]", "Enter")
    r.page.wait_for_function("performance.getEntriesByName('fxviz:go').length >= 2")
    reads = r.page.evaluate("window.fxReads")
    r.page.evaluate("window.fxReads = null")
    r.settle()
    assert reads == []
    key = r.page.get_attribute(".fx-details-body", "data-key")
    assert key and key.startswith("g") and r.page.evaluate(f"fxvizReport.model.groups[{key[1:]}].path").endswith(".attn.c_attn")
    hit = r.page.locator(f'[data-ref=viewport] [data-key="{key}"]').first
    assert "fx-flash" in (hit.get_attribute("class") or "")
    # the same hit again once its flash is over: it flashes again (a frame later)
    flashing = f"""document.querySelector('[data-ref=viewport] [data-key="{key}"]').getAnimations()
      .some(a => a.animationName === 'fx-flash')"""
    r.page.wait_for_function(f"!({flashing})")
    r.page.evaluate(f"fxvizReport.viewer.go('{key}')")
    r.page.wait_for_function(flashing)
