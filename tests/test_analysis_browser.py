"""An analyzer's report, measured in the page (headless Chromium at 1600x1000): it opens with the
analysis's answer in words, the very sentence the terminal prints and the JSON keeps; its tables
sit in a drawer under the graph where every column is readable without scrolling sideways, sort
by any column, select their row's node, and each row's facts are in that node's details too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from fxviz.analyze.compilemap import compile_map
from fxviz.cli import cli
from fxviz.ir import Graph
from fxviz.passes.panels import row, set_panel
from tests import compile_models as cm
from tests.report_browser import ReportPage, page_from_data

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("bundle")]

HEADLINE = "[data-ref=analysis] [data-ref=headline]"
# every column of every table in the drawer lies inside the drawer, and nothing scrolls sideways
FITS = """() => {
  const body = document.querySelector('[data-ref=findings]');
  const right = body.getBoundingClientRect().right;
  const out = {body: [body.scrollWidth, body.clientWidth], tables: [], outside: []};
  for (const s of body.querySelectorAll('.fx-panel:not([hidden])')) {
    const sc = s.querySelector('.fx-panel-scroll');
    out.tables.push([sc.scrollWidth, sc.clientWidth]);
    for (const th of s.querySelectorAll('th')) if (th.getBoundingClientRect().right > right + 0.5) out.outside.push(th.textContent);
  }
  return out;
}"""


@pytest.fixture
def pages(browser: Any, tmp_path: Path) -> Iterator[Any]:
    opened: list[ReportPage] = []

    def open_(graph: Graph | None, name: str, path: Path | None = None) -> ReportPage:
        r = ReportPage(browser, path or page_from_data(graph, tmp_path / f"{name}.html"), width=1600, height=1000)
        opened.append(r)
        return r

    yield open_
    for r in opened:
        r.close()


def words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize(("name", "args"), [
    ("compile", ["compile", "tests.compile_models:item_break", "--backend", "eager"]),
    ("numerics", ["numerics", "fxviz.examples:cnn", "--against", "dtype:bfloat16"]),
    ("passes", ["passes", "fxviz.examples:cnn", "--pass", "tests.pipeline_passes:swap_add_for_sub"]),
])
def test_each_analyzer_page_opens_with_the_terminals_sentence(pages: Any, tmp_path: Path, name: str,
                                                              args: list[str]) -> None:
    html, js = tmp_path / f"{name}.html", tmp_path / f"{name}.json"
    r = CliRunner().invoke(cli, [*args, "--html", str(html), "--json", str(js)])
    assert r.exit_code == 0, r.output
    said = json.loads(js.read_text())["headline"]
    terminal = r.output.splitlines()
    # the terminal opens with the answer (compile prefixes the model's name, as before; a long
    # headline wraps at the terminal's width)
    opening = words(" ".join(terminal[:4]))
    assert words(said) in opening and opening.index(words(said)) <= len("ItemBreak: ")
    page = pages(None, name, html)
    shown = page.page.locator(HEADLINE)
    assert shown.is_visible() and shown.text_content() == said
    # the facts behind it: one click opens the table the answer comes from
    facts = page.page.locator("[data-ref=analysis] .fx-analysis-facts")
    panel = facts.get_attribute("data-panel")
    assert page.page.locator(f"[data-ref=findings] [data-panel={panel}]").is_hidden()
    facts.click()
    table = page.page.locator(f"[data-ref=findings] [data-panel={panel}]")
    assert table.is_visible() and table.locator("tbody tr").count() >= 1
    fit = page.page.evaluate(FITS)
    assert fit["outside"] == [] and all(sw <= cw for sw, cw in [fit["body"], *fit["tables"]]), fit


def test_a_plain_report_has_no_answer_and_no_drawer(pages: Any) -> None:
    from fxviz import examples
    from fxviz.api import capture

    r = pages(capture(*examples.cnn()), "plain")
    assert r.page.locator("[data-ref=analysis]").is_hidden() and r.page.locator("[data-ref=drawer]").is_hidden()


@pytest.fixture(scope="module")
def branch() -> Any:
    torch.manual_seed(0)
    return compile_map(cm.BranchBreak().eval(), (cm.x(),), backend="eager")


def test_the_break_table_is_readable_sorts_and_selects_and_the_hint_is_in_the_nodes_details(
        pages: Any, branch: Any) -> None:
    g = Graph.from_json(branch.graph.to_json())
    (brk,) = branch.breaks
    # torch's own record of the break (explain, on the same model) and what the page says agree
    explained = torch._dynamo.explain(cm.BranchBreak().eval())(cm.x())
    torch._dynamo.reset()
    assert (explained.graph_count, explained.graph_break_count) == (len(branch.graphs), branch.break_count) == (2, 1)
    # a second, wide table: long words wrap, numbers sort as numbers
    ops = [n.name for n in g.ops][:3]
    long = "a reason long enough to wrap several times over " * 6 + "torch._dynamo.exc.Unsupported_without_any_space_in_it" * 3
    set_panel(g, "wide", title="wide", columns=["line", "category", "reason", "count", "hint", "broke in (library)", "max rel"],
              rows=[row("m.py:1", "data-dependent branch", long, 3, long, "torch/nn/functional.py:12", 0.5, node=ops[0]),
                    row("m.py:2", "print", "print()", 12, "remove it", "", 20.0, node=ops[1]),
                    row("m.py:3", "item", "Tensor.item()", 1, "", "", 3.0, node=ops[2])])
    r = pages(g, "branch")
    assert r.page.locator(HEADLINE).text_content() == branch.headline()
    tabs = r.page.locator("[data-ref=drawerBar] .fx-drawer-tab")
    assert tabs.all_text_contents()[0] == "graph breaks (1)" and "wide (3)" in tabs.all_text_contents()
    for name in ("breaks", "wide"):
        r.page.locator(f"[data-ref=drawerBar] .fx-drawer-tab[data-panel={name}]").click()
        fit = r.page.evaluate(FITS)
        assert fit["outside"] == [] and all(sw <= cw for sw, cw in [fit["body"], *fit["tables"]]), (name, fit)
    # the drawer resizes: drag its top edge up and the table gets that much taller, the graph shorter
    body, svg = r.page.locator("[data-ref=findings]"), r.page.locator("[data-ref=svg]")
    h0, g0 = body.bounding_box()["height"], svg.bounding_box()["height"]
    handle = r.page.locator("[data-ref=drawerBar] .fx-drawer-handle").bounding_box()
    x, y = handle["x"] + handle["width"] / 2, handle["y"] + handle["height"] / 2
    r.page.mouse.move(x, y)
    r.page.mouse.down()
    r.page.mouse.move(x, y - 150, steps=5)
    r.page.mouse.up()
    assert abs(body.bounding_box()["height"] - (h0 + 150)) <= 2 and svg.bounding_box()["height"] < g0 - 140
    # sorting: click a header (numbers as numbers: 1 < 3 < 12, not "1" < "12" < "3"), again to reverse
    wide = r.page.locator("[data-ref=findings] [data-panel=wide]")

    def column(j: int) -> list[str]:
        return wide.locator("tbody tr").evaluate_all(f"rows => rows.map(r => r.cells[{j}].textContent)")

    wide.locator("th", has_text="count").click()
    assert column(3) == ["1", "3", "12"]
    assert wide.locator("th", has_text="count").get_attribute("aria-sort") == "ascending"
    wide.locator("th", has_text="count").click()
    assert column(3) == ["12", "3", "1"]
    wide.locator("th", has_text="max rel").click()
    assert column(6) == ["0.5", "3", "20"]
    wide.locator("th", has_text="line").click()
    assert column(0) == ["m.py:1", "m.py:2", "m.py:3"]
    # a row selects its node, and the row is marked as the selection's
    wide.locator("tbody tr").nth(1).click()
    r.settle()
    assert r.details()["name"] == ops[1]
    assert "fx-finding-current" in (wide.locator("tbody tr").nth(1).get_attribute("class") or "")
    # another row's node selected: that row is marked instead (one marked row, not two)
    wide.locator("tbody tr").nth(2).click()
    r.settle()
    marked = wide.locator("tbody tr").evaluate_all("rows => rows.map(r => r.classList.contains('fx-finding-current'))")
    assert marked == [False, False, True]
    # the break's row: its node's details hold the row's facts, the torch.cond hint among them
    r.page.locator("[data-ref=drawerBar] .fx-drawer-tab[data-panel=breaks]").click()
    r.page.locator("[data-ref=findings] [data-panel=breaks] tbody tr").first.click()
    r.settle()
    details = r.details()
    assert details["name"] == brk.node
    assert "torch.cond" in brk.hint and details["hint"] == brk.hint
    assert details["count"] == "1" and details["reason"] == brk.reason
    # the answer's "show in graph" selects the break node too
    wide_first = r.page.locator("[data-ref=drawerBar] .fx-drawer-tab[data-panel=wide]")
    wide_first.click()
    wide.locator("tbody tr").nth(0).click()
    r.settle()
    assert r.details()["name"] != brk.node
    r.page.locator("[data-ref=analysis] .fx-analysis-go").click()
    r.settle()
    assert r.details()["name"] == brk.node
