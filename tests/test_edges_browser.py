"""Issue 19 in Chromium, points 1, 4 and 6: GPT-2's tied lm_head weight is drawn from wte (its
``weight`` node when wte is open, the boxes around it when closed) and the lm_head box says it is
shared; each call box of the example CNN's shared max_pool counts its own op; the header says how
the graph was captured; a node's details name its torch call as a user writes it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import resolve_name

import fxviz
from fxviz import examples
from tests.report_browser import ReportPage, page_from_data

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("bundle")]


@pytest.fixture(scope="module")
def graphs() -> dict[str, Any]:
    pytest.importorskip("transformers")
    from tests.transformers_zoo import gpt2

    model, args, kwargs = gpt2(n_layer=1)
    assert model.lm_head.weight is model.transformer.wte.weight  # torch's record of the tie
    cnn, cnn_args = examples.cnn()
    return {"gpt2": fxviz.capture(model, args, kwargs), "cnn": fxviz.capture(cnn, cnn_args, method="export")}


@pytest.fixture
def open_report(browser: Any, graphs: dict[str, fxviz.Graph], tmp_path: Path) -> Iterator[Any]:
    opened: list[ReportPage] = []

    def open_(name: str) -> ReportPage:
        r = ReportPage(browser, page_from_data(graphs[name], tmp_path / f"{name}.html"), width=1600, height=1000)
        opened.append(r)
        return r

    yield open_
    for r in opened:
        r.close()


def box(r: ReportPage, path: str) -> int:
    return int(r.page.evaluate(f"fxvizReport.model.groups.findIndex(g => g.path === {path!r})"))


def node(r: ReportPage, name: str) -> int:
    return int(r.page.evaluate(f"fxvizReport.model.nodeIndex({name!r})"))


def drawn_edges(r: ReportPage) -> set[tuple[str, str]]:
    return {tuple(e) for e in r.page.eval_on_selector_all(
        "[data-ref=viewport] path.fx-edge[data-from]", "els => els.map(e => [e.dataset.from, e.dataset.to])")}


def test_the_tied_lm_head_weight_is_drawn_from_wte(open_report: Any) -> None:
    r = open_report("gpt2")
    t, wte, head = box(r, "transformer"), box(r, "transformer.wte"), box(r, "lm_head")
    weight = node(r, "transformer.wte.weight")
    assert min(t, wte, head, weight) >= 0
    r.js("fxvizReport.viewer.collapseAll()")
    edges = drawn_edges(r)
    # closed: the weight leaves the transformer box downwards into lm_head, and nothing runs from
    # lm_head back up into the transformer (where the wrong edge used to enter at its top port)
    assert (f"g{t}", f"g{head}") in edges
    assert (f"g{head}", f"g{t}") not in edges
    root = r.page.evaluate(f"fxvizReport.viewer.engine.level(-1).edges.filter(e => e.to === 'g{head}').map(e => [e.from, e.src])")
    assert [f"g{t}", weight] in root
    # open transformer, then wte: the weight node itself is the source, through wte's bottom port
    r.js(f"fxvizReport.viewer.setOpen([{t}, {wte}])")
    assert {"transformer", "transformer.wte"} <= r.open_paths()
    assert (f"n{weight}", "out") in drawn_edges(r)
    inner = r.page.evaluate(f"fxvizReport.viewer.engine.level({t}).edges.filter(e => e.to === 'out' && e.src === {weight}).map(e => e.from)")
    assert inner == [f"g{wte}"]
    r.shot("gpt2-tied-weight")
    # lm_head's details say whose weight it reads, and link to it
    r.js(f"fxvizReport.viewer.go('g{head}')")
    details = r.details()
    assert "weight shared with transformer.wte" in details["parameters"]
    r.page.click("[data-ref=details] .fx-shared a")
    r.settle()
    assert r.page.get_attribute("[data-ref=details] .fx-details-body", "data-key") == f"n{weight}"
    assert r.details()["shared with"] == "lm_head.weight"


def test_each_max_pool_call_box_counts_its_own_op(open_report: Any) -> None:
    r = open_report("cnn")
    r.js("fxvizReport.viewer.collapseAll()")
    subs = r.page.eval_on_selector_all('.fx-box[data-path="max_pool"] .fx-box-sub', "els => els.map(e => e.textContent)")
    assert len(subs) == 3  # one box per call
    assert all(s.split(" · ")[0] == "1 op" for s in subs), subs
    r.js(f"fxvizReport.viewer.go('g{box(r, 'max_pool')}')")
    assert r.details()["ops"] == "1"


def test_the_header_says_how_the_graph_was_captured_and_details_name_the_torch_call(open_report: Any) -> None:
    r = open_report("cnn")
    assert r.page.text_content(".fx-method") == "captured by torch.export"
    assert r.page.text_content(".fx-totals").startswith("15 ops · ")  # type: ignore[union-attr]
    relu = r.page.evaluate("fxvizReport.model.groups.length") and r.page.evaluate(
        "[...Array(fxvizReport.model.count).keys()].find(i => fxvizReport.model.node(i).t === 'aten.relu.default')")
    r.js(f"fxvizReport.viewer.go('n{relu}')")
    details = r.details()
    assert details["torch call"] == resolve_name(torch.relu) == "torch.relu"
    assert "torch_fn" not in details.get("attributes", "")
