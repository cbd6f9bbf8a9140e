"""The report of a training step (``capture(backward=True)``): the forward / backward choice hides
the other pass's ops, and the saved-activations table adds up to what autograd saved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import fxviz
from tests import backward_models as bm
from tests.report_browser import ReportPage, page_from_data
from tests.viewmodel import page_data

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("bundle")]

VISIBLE = """() => [...document.querySelectorAll('[data-ref=viewport] .fx-leaf')]
  .filter(e => e.getBoundingClientRect().width > 0).map(e => e.dataset.key)"""
EDGES = """() => [...document.querySelectorAll('[data-ref=viewport] .fx-edge')]
  .filter(e => getComputedStyle(e).display !== 'none').map(e => [e.dataset.from, e.dataset.to])"""


def test_backward_only_hides_every_forward_op_and_the_saved_table_adds_up(browser: Any, tmp_path: Path) -> None:
    model, args = bm.mlp()
    graph = fxviz.capture(model, args, backward=True)
    saved, _ = bm.torch_step(*bm.mlp())  # torch's own count of the step's saved bytes
    assert sum(s.bytes for s in graph.saved) == saved == 16384
    path = page_from_data(graph, tmp_path / "mlp.html")
    data = page_data(path.read_text(encoding="utf-8"))
    kinds = [data["ops"][f][0] for f in data["nodes"]["f"]]
    phase = {n.name: n.phase for n in graph.nodes}
    names = data["nodes"]["n"]
    fwd_ops = {f"n{i}" for i, n in enumerate(names) if kinds[i] == "op" and phase[n] == "forward"}
    bwd_ops = {f"n{i}" for i, n in enumerate(names) if kinds[i] == "op" and phase[n] == "backward"}
    assert fwd_ops and bwd_ops
    page = ReportPage(browser, path, width=1600, height=1000)
    try:
        page.js("document.querySelector('[data-action=expand]').click()")
        both = set(page.page.evaluate(VISIBLE))
        assert fwd_ops | bwd_ops <= both
        choice = page.page.locator("[data-ref=phase]")
        assert choice.is_visible()
        choice.select_option("backward")
        page.settle()
        shown = set(page.page.evaluate(VISIBLE))
        assert not fwd_ops & shown and bwd_ops <= shown
        assert not any(a in fwd_ops or b in fwd_ops for a, b in page.page.evaluate(EDGES))
        assert "ph=backward" in page.page.evaluate("new Promise(r => setTimeout(() => r(location.hash), 400))")
        choice.select_option("forward")
        page.settle()
        shown = set(page.page.evaluate(VISIBLE))
        assert fwd_ops <= shown and not bwd_ops & shown
        # the headline: total and the module that saved most; its table lists every record
        headline = page.page.locator("[data-ref=analysis] [data-ref=headline]").text_content() or ""
        assert f"{saved:,} bytes" in headline and "most in" in headline
        page.page.locator("[data-ref=analysis] .fx-analysis-facts").click()
        table = page.page.locator("[data-ref=findings] [data-panel=saved]")
        assert table.is_visible()
        heads = table.locator("th").all_text_contents()
        col = heads.index("bytes")
        cells = [r.locator("td").nth(col).text_content() or "" for r in table.locator("tbody tr").all()]
        assert len(cells) == len(graph.saved)
        assert sum(int(c.replace(",", "")) for c in cells) == saved
        # the memory timeline: its peak is the total, every activation alive when the forward ends
        assert int(table.locator(".fx-timeline-peak").get_attribute("data-peak") or 0) == saved
        # a row selects its op
        table.locator("tbody tr").first.click()
        page.settle()
        first = graph.saved[0].node
        assert page.page.locator(f"[data-ref=viewport] [data-name='{first}'].fx-selected").count() == 1
        page.shot("backward-saved")
    finally:
        page.close()
