"""The diff page in headless Chromium: both graphs drawn side by side in the same viewer, kept in
step (opening a box opens its pair, selecting a node selects its pair, panning one side moves
the other), and the differences, in words, as the drawer's table (the page's one list of them):
a row shows its difference on both sides, its cell of one side's nodes that side. The first tests
draw data built by hand (pairs by node name); the later ones open the page fxviz writes
(`fxviz diff --html`, ``Diff.to_html``) for models with control flow that depends on the input:
what differs is coloured on its side, the pair of a node is the one the diff aligned, a failed
export says why on its side."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import fxviz
from fxviz import examples
from fxviz.ir import Graph
from fxviz.render.diffpage import differences_panel
from fxviz.render.html import view_model
from tests.fallback_models import DataDependentIf
from tests.report_browser import ReportPage, page_from_data

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("bundle")]


def status_overlay(vm: dict[str, Any], status: list[str]) -> None:
    """The `diff` category overlay each side carries (WAVE2.md §3)."""
    colours = {"matched": "#009e73", "differs": "#d55e00", "only in export": "#e69f00", "only in eager": "#cc79a7"}
    vm["overlays"] = [{"name": "diff", "label": "diff status", "kind": "category", "unit": "", "scale": "linear",
                       "min": None, "max": None, "description": "",
                       "categories": {k: {"label": k, "color": c} for k, c in colours.items()},
                       "nodes": status, "groups": [None] * len(vm["groups"])}]
    vm["overlay"] = "diff"


def diff_data(a: Graph, b: Graph, differences: list[dict[str, Any]]) -> dict[str, Any]:
    differences = [{"module": None, "call": 0, "informational": False, "at": [None, None], "detail": "", **x} for x in differences]
    va, vb = view_model(a), view_model(b)
    ia = {n: i for i, n in enumerate(va["nodes"]["n"])}
    ib = {n: i for i, n in enumerate(vb["nodes"]["n"])}
    pairs = [[ia[name], ib[name]] for name in ia if name in ib]
    ga = {(g["path"], g["call"], g["run"]): i for i, g in enumerate(va["groups"])}
    gb = {(g["path"], g["call"], g["run"]): i for i, g in enumerate(vb["groups"])}
    group_pairs = [[ga[k], gb[k]] for k in ga if k in gb]
    hit_a = {i for d in differences for i in d["a"]}
    hit_b = {i for d in differences for i in d["b"]}
    status_overlay(va, ["differs" if i in hit_a else "matched" if n in ib else "only in export" for i, n in enumerate(va["nodes"]["n"])])
    status_overlay(vb, ["differs" if i in hit_b else "matched" if n in ia else "only in eager" for i, n in enumerate(vb["nodes"]["n"])])
    labels = ["export", "eager"]
    return {"v": 3, "diff": {"labels": labels, "a": va, "b": vb, "pairs": pairs, "groupPairs": group_pairs,
                             "differences": differences, "summary": {"significant": 1, "informational": len(differences) - 1},
                             "panels": [differences_panel((a, b), labels, differences)]}}


@pytest.fixture(scope="module")
def cnn_pair() -> tuple[Graph, Graph]:
    m, a = examples.cnn()
    return fxviz.capture(m, a, method="export"), fxviz.capture(m, a, method="eager")


ROWS = "[data-ref=findings] [data-panel=differences] tbody tr"


def row(page: Any, k: int) -> Any:
    """The drawer's row of difference ``k`` (its index in the page's data)."""
    return page.locator(f'{ROWS}[data-key="d{k}"]')


def side_link(page: Any, k: int, side: str) -> Any:
    """The cell of difference ``k``'s row that shows it on ``side``."""
    return row(page, k).locator(f'a.fx-cell-link[data-key="d{k}:{side}"]')


def selected(page: Any, side: str) -> str | None:
    el = page.locator(f'.fx-pane[data-side="{side}"] .fx-selected')
    return el.first.get_attribute("data-key") if el.count() else None


def test_the_diff_view_links_each_difference_to_both_sides(browser: Any, cnn_pair: tuple[Graph, Graph], tmp_path: Path) -> None:
    a, b = cnn_pair
    ia = {n.name: i for i, n in enumerate(a.nodes)}
    ib = {n.name: i for i, n in enumerate(b.nodes)}
    differences = [
        {"id": "d1", "kind": "decomposed", "words": "decomposed", "message": "conv2d_2 is decomposed in eager",
         "a": [ia["conv2d_2"]], "b": [ib["conv2d_2"]], "source": ["/x/examples.py", 30, "forward", "x = self.secondary_conv(x)"]},
        {"id": "d2", "kind": "only_in_a", "words": "only in export", "message": "view", "a": [ia["view"]], "b": [],
         "source": None, "informational": True},
    ]
    path = page_from_data(a, tmp_path / "diff.html", data=diff_data(a, b, differences))
    r = ReportPage(browser, path, width=1600, height=1000)
    page = r.page
    assert page.locator(".fx-pane").count() == 2
    assert [t.strip() for t in page.eval_on_selector_all(".fx-pane-title", "els => els.map(e => e.textContent)")] == ["export", "eager"]
    # the differences are the drawer's table, open with the page, the page's one list of them
    rows = page.locator(ROWS)
    assert rows.count() == 2 and rows.first.is_visible()
    assert page.locator(".fx-sidebar").is_hidden()
    # statuses in words, never raw codes
    assert rows.evaluate_all("rs => rs.map(r => r.cells[0].textContent)") == ["decomposed", "only in export"]
    assert "only_in_a" not in (page.text_content("[data-ref=findings]") or "")
    assert "1 significant difference · 1 informational" in (page.text_content(".fx-totals") or "")
    # the page opens on the first significant difference, shown on both sides
    assert selected(page, "a") == f"n{ia['conv2d_2']}" and selected(page, "b") == f"n{ib['conv2d_2']}"
    r.shot("diff-first")
    # each side's link goes to that side's node (and the other side follows to its pair)
    r.js("fxvizReport.viewers.a.collapseAll().then(() => fxvizReport.viewers.b.collapseAll())")
    side_link(page, 0, "b").click()
    r.settle()
    assert selected(page, "b") == f"n{ib['conv2d_2']}"
    assert page.locator(f'.fx-pane[data-side="b"] [data-key="n{ib["conv2d_2"]}"].fx-diff-hit').count() == 1
    assert (page.text_content("[data-ref=details] .fx-diff-side") or "").startswith("in eager · pair in export: ")
    assert "fx-finding-current" in (row(page, 0).get_attribute("class") or "")
    side_link(page, 1, "a").click()
    r.settle()
    assert selected(page, "a") == f"n{ia['view']}"
    # a side without the difference's nodes has an empty cell, which goes nowhere of its own
    assert row(page, 1).evaluate("r => [r.cells[2].textContent, r.cells[3].textContent]") == ["view", ""]
    assert side_link(page, 1, "b").count() == 0
    # shown as a whole, a difference with no place on one side leaves nothing selected there (the
    # node selected before is not its pair)
    row(page, 0).click()
    r.settle()
    assert selected(page, "b") == f"n{ib['conv2d_2']}"
    row(page, 1).click()
    r.settle()
    assert selected(page, "a") == f"n{ia['view']}" and selected(page, "b") is None
    # from the keyboard too: Enter on a side's cell goes to that side, not to the whole row
    side_link(page, 0, "b").focus()
    page.keyboard.press("Enter")
    r.settle()
    assert selected(page, "b") == f"n{ib['conv2d_2']}"
    assert (page.text_content("[data-ref=details] .fx-diff-side") or "").startswith("in eager · pair in export: ")
    # opening a box opens its pair
    r.js("fxvizReport.viewers.a.collapseAll().then(() => fxvizReport.viewers.b.collapseAll())")
    page.locator('.fx-pane[data-side="a"] .fx-box[data-path="fully_connected1"]').dispatch_event("dblclick")
    r.settle()
    assert page.locator('.fx-pane[data-side="b"] .fx-cluster[data-path="fully_connected1"]').count() == 1
    # panning one side moves the other, keeping paired items level
    before = page.evaluate("fxvizReport.viewers.b.pz.y")
    page.evaluate("fxvizReport.viewers.a.pz.panBy(0, -120)")
    page.wait_for_function(f"fxvizReport.viewers.b.pz.y !== {before}")
    ya, yb = page.evaluate("""(() => {
      const [a, b] = ['a', 'b'].map(s => document.querySelector(`.fx-pane[data-side="${s}"] .fx-cluster[data-path="fully_connected1"] > rect`).getBoundingClientRect().y);
      return [a, b];
    })()""")
    assert abs(ya - yb) < 2
    r.shot("diff-synced")
    r.close()


def test_a_data_dependent_diff_shows_the_eager_ops_and_the_failure_site(browser: Any, tmp_path: Path) -> None:
    import torch

    eager = fxviz.capture(DataDependentIf().eval(), (torch.randn(2, 8),))
    assert eager.method == "eager"
    failed = Graph(name="DataDependentIf", method="export")
    site = next(i for i, n in enumerate(eager.nodes) if n.kind == "op" and n.target.endswith("__bool__"))
    differences = [{"id": "f", "kind": "export_failed", "words": "export failed here",
                    "message": "GuardOnDataDependentSymNode: Could not guard on data-dependent expression",
                    "detail": "torch.fx.experimental.symbolic_shapes.GuardOnDataDependentSymNode: Eq(u0, 1)\n  at line 31",
                    "a": [], "b": [site], "source": ["fallback_models.py", 31, "forward", "if y.sum() > 0:"]}]
    path = page_from_data(eager, tmp_path / "diff-dd.html", data=diff_data(failed, eager, differences))
    r = ReportPage(browser, path, width=1600, height=1000)
    page = r.page
    # the eager side draws its ops and selects the failure site, marked data-dependent
    ops = page.eval_on_selector_all('.fx-pane[data-side="b"] .fx-node', "els => els.map(e => e.dataset.name)")
    assert {"linear", "sum", "gt", "__bool__"} <= set(ops) or len(ops) >= 4
    site_el = page.locator(f'.fx-pane[data-side="b"] [data-key="n{site}"]')
    assert "fx-selected" in (site_el.get_attribute("class") or "") and "fx-dd" in (site_el.get_attribute("class") or "")
    assert "⚠" in (site_el.text_content() or "")
    assert row(page, 0).evaluate("r => [...r.cells].map(c => c.textContent)")[:4] == [
        "export failed here", differences[0]["message"], "", "__bool__"]
    # the failure's long explanation is in the site's details, under the row's facts
    facts = page.locator("[data-ref=details] .fx-facts [data-panel=differences]")
    assert facts.count() == 1
    facts.locator(".fx-fact-detail summary").click()
    assert "Eq(u0, 1)" in (facts.locator(".fx-fact-detail pre").text_content() or "")
    r.shot("diff-data-dependent")
    r.close()


# ---- the page fxviz writes: `fxviz diff --html`, Diff.to_html --------------------------------------


def rgb(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[k:k + 2], 16) for k in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


FILL = """el => getComputedStyle(el.querySelector('rect:not(.fx-stack)')).fill"""


def node(page: Any, side: str, name: str) -> Any:
    return page.locator(f'.fx-pane[data-side="{side}"] .fx-node[data-name="{name}"]')


def test_the_compare_page_draws_both_graphs_and_links_each_node_to_its_pair(browser: Any, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from fxviz.cli import cli
    from fxviz.render.diffpage import DIFF_COLORS
    from tests import compile_models
    from tests.test_diff_page import page_data

    # BatchBranch branches on its batch size: export, with symbolic sizes, reads the size with a
    # sym_size op eager never runs; the page is what a user gets from `fxviz diff --html`
    path = tmp_path / "compare.html"
    r = CliRunner().invoke(cli, ["diff", f"{compile_models.__file__}:batch_branch", "--html", str(path)])
    assert r.exit_code == 0, r.output
    data = page_data(path.read_text(encoding="utf-8"))["diff"]
    na, nb = data["a"]["nodes"]["n"], data["b"]["nodes"]["n"]
    (sym,) = [n for n in na if n.startswith("sym_size")]
    assert not [n for n in nb if n.startswith("sym_size")]
    page_ = ReportPage(browser, path, width=1600, height=1000)
    page = page_.page
    # two drawn graphs, each titled with its capture
    assert page.eval_on_selector_all(".fx-pane-label", "els => els.map(e => e.textContent)") == ["export", "eager"]
    facts = page.eval_on_selector_all(".fx-pane-facts", "els => els.map(e => e.textContent)")
    for f, cap in zip(facts, data["captures"], strict=True):
        assert f.startswith(f"{cap['method']} · {cap['ops']} ops · "), f
    for side in ("a", "b"):
        drawn = page.eval_on_selector_all(f'.fx-pane[data-side="{side}"] .fx-node', "els => els.map(e => e.dataset.name)")
        assert {"x", "div", "output"} <= set(drawn), (side, drawn)
    # what only export has is highlighted on its side, in the colour the legend gives it; what
    # matched is muted on both sides
    assert node(page, "a", sym).evaluate(FILL) == rgb(DIFF_COLORS["only_in_a"])
    for side in ("a", "b"):
        assert node(page, side, "div").evaluate(FILL) == rgb(DIFF_COLORS["matched"])
    legend = page.text_content(".fx-legend") or ""
    assert "only in export" in legend and "matched" in legend and "only_in" not in legend
    # selecting a node selects its pair, the pair the diff aligned
    div_a = na.index("div")
    (div_b,) = [j for i, j in data["pairs"] if i == div_a]
    assert nb[div_b] == "div"
    node(page, "a", "div").click()
    page_.settle()
    assert selected(page, "a") == f"n{div_a}" and selected(page, "b") == f"n{div_b}"
    assert "pair in eager: div" in (page.text_content("[data-ref=details] .fx-diff-side") or "")
    # and the other way
    x_b = nb.index("x")
    node(page, "b", "x").click()
    page_.settle()
    assert selected(page, "b") == f"n{x_b}" and selected(page, "a") == f"n{na.index('x')}"
    # hovering a node outlines its pair
    node(page, "b", "div").dispatch_event("mouseover")
    assert "fx-pair-hover" in (node(page, "a", "div").get_attribute("class") or "")
    # a row of the differences selects both sides
    k, shape = next((k, d) for k, d in enumerate(data["differences"]) if d["a"] and d["b"])
    row(page, k).click()
    page_.settle()
    assert selected(page, "a") == f"n{shape['a'][0]}" and selected(page, "b") == f"n{shape['b'][0]}"
    # its cell of one side shows that side's node in the details
    side_link(page, k, "b").click()
    page_.settle()
    assert (page.text_content("[data-ref=details] .fx-diff-side") or "").startswith("in eager · pair in export: ")
    k, only = next((k, d) for k, d in enumerate(data["differences"]) if d["kind"] == "only_in_a")
    row(page, k).click()
    page_.settle()
    assert selected(page, "a") == f"n{na.index(sym)}"
    assert page.locator(f'.fx-pane[data-side="a"] [data-key="n{na.index(sym)}"].fx-diff-hit').count() == 1
    page_.shot("compare-batch-branch")
    page_.close()


def test_a_compare_whose_export_failed_says_why_on_the_export_side(browser: Any, tmp_path: Path) -> None:
    from tests.models import data_dependent
    from tests.test_diff_page import page_data

    model, args, kwargs = data_dependent()
    d = fxviz.compare(model, args, kwargs)
    path = tmp_path / "failed.html"
    d.to_html(str(path))
    nb = page_data(path.read_text(encoding="utf-8"))["diff"]["b"]["nodes"]["n"]
    r = ReportPage(browser, path, width=1600, height=1000)
    page = r.page
    empty = page.locator('.fx-pane[data-side="a"] .fx-pane-empty')
    text = empty.text_content() or ""
    assert "export could not capture this model" in text and "data-dependent" in text
    assert page.locator('.fx-pane[data-side="a"] .fx-node').count() == 0
    assert "export failed vs eager" in (page.text_content("[data-ref=method]") or "")
    # the eager side is drawn, the op the forward read a value at is selected and coloured
    site = next(x for x in d.differences if x.kind == "capture_failed")
    assert x_site(d, site) in nb
    assert selected(page, "b") == f"n{nb.index(x_site(d, site))}"
    assert "only in eager" in (page.text_content(".fx-legend") or "")
    r.shot("compare-export-failed")
    r.close()


def x_site(d: Any, x: Any) -> str:
    assert x.b is not None and x.b.nodes
    return str(x.b.nodes[0])


def test_a_region_that_differs_is_highlighted_on_both_sides_while_closed(browser: Any, tmp_path: Path) -> None:
    from fxviz.render.diffpage import DIFF_COLORS
    from tests.test_diff_page import page_data, stack_diff

    path = tmp_path / "stack.html"
    stack_diff().to_html(str(path))
    r = ReportPage(browser, path, width=1600, height=1000)
    page = r.page
    r.js("fxvizReport.viewers.a.collapseAll().then(() => fxvizReport.viewers.b.collapseAll())")
    for side in ("a", "b"):
        box = page.locator(f'.fx-pane[data-side="{side}"] .fx-box').first
        assert box.get_attribute("data-path") == "h.0-1"
        colour = box.evaluate("el => getComputedStyle(el).getPropertyValue('--box').trim()")
        assert colour.lower() == DIFF_COLORS["differs"], (side, colour)
    # the row of an op only in old selects it on old's side and, on new's, opens the call it
    # would be in (h.1.fc, which holds new's matmul instead)
    data = page_data(path.read_text(encoding="utf-8"))["diff"]
    k, only = next((k, x) for k, x in enumerate(data["differences"]) if x["kind"] == "only_in_a")
    row(page, k).click()
    r.settle()
    assert selected(page, "a") == f"n{only['a'][0]}"
    assert selected(page, "b") == f"g{only['at'][1]}"
    assert page.locator('.fx-pane[data-side="b"] .fx-cluster[data-path="h.1.fc"]').count() == 1
    assert page.locator('.fx-pane[data-side="b"] .fx-cluster[data-path="h.1.fc"] .fx-node').count() >= 1
    r.close()


def test_the_diff_page_says_its_answer_and_its_differences_are_the_drawers_table(browser: Any, tmp_path: Path) -> None:
    from tests.test_diff_page import page_data, stack_diff

    d = stack_diff()
    path = tmp_path / "stack.html"
    d.to_html(str(path))
    data = page_data(path.read_text(encoding="utf-8"))["diff"]
    na, nb = data["a"]["nodes"]["n"], data["b"]["nodes"]["n"]
    # with its script off, the page still says its answer and lists the differences
    ctx = browser.new_context(java_script_enabled=False, viewport={"width": 1600, "height": 1000})
    off = ctx.new_page()
    off.goto(path.as_uri())
    assert off.locator("[data-ref=analysis]").inner_text().strip() == d.headline()
    assert off.locator("[data-ref=model]").inner_text() == "Stack: old vs new"
    rows = off.locator("[data-ref=findings] [data-panel=differences] tbody tr")
    assert rows.count() == 2 and rows.first.is_visible()
    assert rows.evaluate_all("rs => rs.map(r => r.cells[1].textContent)") == [x.message for x in d.differences]
    assert "script, which is off" in off.locator("[data-ref=canvas]").inner_text()
    ctx.close()
    r = ReportPage(browser, path, width=1600, height=1000)
    page = r.page
    assert page.locator("[data-ref=analysis] [data-ref=headline]").text_content() == d.headline()
    assert page.locator("[data-ref=drawerBar] .fx-drawer-tab").all_text_contents() == ["differences (2)"]
    page.locator("[data-ref=analysis] .fx-analysis-facts").click()
    table = page.locator("[data-ref=findings] [data-panel=differences]")
    assert table.is_visible()
    # sortable: by the new side's column, the row of the op only in new comes first
    table.locator("th", has_text="new").click()
    assert table.locator("tbody tr").evaluate_all("rs => rs.map(r => r.cells[3].textContent)") == ["matmul", ""]
    # a row shows its difference on both sides: the op only in old there, and on new's side the
    # box of the call it would be in
    only_a = next(x for x in data["differences"] if x["kind"] == "only_in_a")
    table.locator("tbody tr", has_text=d.differences[0].message).click()
    r.settle()
    assert selected(page, "a") == f"n{only_a['a'][0]}" and selected(page, "b") == f"g{only_a['at'][1]}"
    assert "fx-finding-current" in (table.locator("tbody tr", has_text=d.differences[0].message).get_attribute("class") or "")
    # a node's details list the differences that name it, as the rows say them
    node(page, "b", "fc_1").click()
    r.settle()
    assert selected(page, "b") == f"n{nb.index('fc_1')}"
    facts = page.locator("[data-ref=details] .fx-facts [data-panel=differences]")
    assert facts.count() == 1 and "only in new: matmul" in (facts.text_content() or "")
    assert "fx-finding-current" in (table.locator("tbody tr", has_text="only in new").get_attribute("class") or "")
    assert na  # side a drew its nodes too
    r.close()


# every place on the page (but the details of the selection, which quote the rows about it) whose
# own text says `text`
SAID = """([root, text]) => {
  const out = [];
  const walk = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let t = walk.nextNode(); t; t = walk.nextNode()) {
    const el = t.parentElement;
    if (!t.textContent.includes(text) || el.closest('[data-ref=details]')) continue;
    const where = el.closest('[data-ref=findings]') ? 'drawer' : (el.closest('[data-ref]') || el).dataset.ref || el.className;
    out.push([where, el.checkVisibility ? el.checkVisibility() : !!el.offsetParent]);
  }
  return out;
}"""


def test_the_differences_are_listed_once_in_the_drawer_and_nowhere_else(browser: Any, tmp_path: Path) -> None:
    """The diff page lists its differences in one place, the drawer's table: a second list of
    them (the sidebar's list it once had beside the table) fails this test."""
    from fxviz.graphdiff import diff
    from tests.test_diff_page import stack_diff

    d = stack_diff()
    path = tmp_path / "stack.html"
    d.to_html(str(path))
    r = ReportPage(browser, path, width=1600, height=1000)
    page = r.page
    root = page.locator("#fxviz-app").element_handle()
    for x in d.differences:
        assert page.evaluate(SAID, [root, x.message]) == [["drawer", True]], x.message
    # nothing but the table lists them: the sidebar is gone and the graphs have its width
    assert page.locator(".fx-sidebar").is_hidden()
    panes = page.locator(".fx-panes").bounding_box()
    assert panes is not None and panes["x"] < 2 and panes["width"] >= 1600 - 300 - 2
    assert r.errors == []
    r.close()
    # graphs that agree: the answer says so, and there is no table (nor any other list)
    same = diff(d.a, d.a, labels=("old", "new"))
    same.to_html(str(path))
    r = ReportPage(browser, path, width=1600, height=1000)
    assert r.page.locator("[data-ref=analysis] [data-ref=headline]").text_content() == same.headline() == "✓ no significant differences"
    assert r.page.locator("[data-ref=drawer]").is_hidden() and r.page.locator(".fx-sidebar").is_hidden()
    r.close()
