"""The header toolbar of every page at the issue's viewport (headless Chromium at 1600x1000): the
title, the search box and the tools are one row on the graph page and on each analysis page
(compile, numerics, passes, diff, a training step's), for a real model (GPT-2, 2 tiny layers),
the model's name whole; what is used now and then (save as SVG or PNG, source links, theme)
sits behind the ⋯ menu."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fxviz.cli import cli
from tests.report_browser import ReportPage

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("bundle")]

MODEL = "tests.transformers_zoo:gpt2"
PAGES = {
    "graph": ["html", MODEL, "-o"],
    "compile": ["compile", MODEL, "--backend", "eager", "--html"],
    "numerics": ["numerics", MODEL, "--against", "dtype:bfloat16", "--html"],
    "passes": ["passes", MODEL, "--pass", "tests.pipeline_passes:swap_add_for_sub", "--html"],
    "diff": ["diff", MODEL, "--html"],
    # a training step: the phase switch and, coloured by FLOPs, the scale switch are shown too
    "backward": ["html", MODEL, "--backward", "--overlay", "flops", "-o"],
}

# each control of the header as [what, left, top, right, bottom], the visible ones
CONTROLS = """() => {
  const h = document.querySelector('.fx-header');
  const items = [h.querySelector('.fx-title'), h.querySelector('.fx-search'), ...h.querySelectorAll('.fx-tools > *')]
    .filter(e => e.checkVisibility());
  return {header: h.getBoundingClientRect().height, width: document.documentElement.clientWidth,
    items: items.map(e => { const r = e.getBoundingClientRect();
      return [e.dataset.ref || e.dataset.action || e.className, r.left, r.top, r.right, r.bottom]; })};
}"""


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("toolbar")
    paths = {}
    for name, args in PAGES.items():
        path = out / f"{name}.html"
        r = CliRunner().invoke(cli, [*args, str(path)])
        assert r.exit_code == 0 and path.is_file(), (name, r.output[-2000:])
        paths[name] = path
    return paths


@pytest.mark.parametrize("name", list(PAGES))
def test_the_toolbar_is_one_row_at_1600x1000(browser: Any, pages: dict[str, Path], name: str) -> None:
    r = ReportPage(browser, pages[name], width=1600, height=1000)
    page = r.page
    got = page.evaluate(CONTROLS)
    names = [i[0] for i in got["items"]]
    assert {"fx-title", "fx-search", "fit", "expand", "collapse", "more"} <= set(names), names
    # one row: a horizontal line crosses every control, and the header is one control tall
    top, bottom = max(i[2] for i in got["items"]), min(i[4] for i in got["items"])
    tallest = max(i[4] - i[2] for i in got["items"])
    assert bottom > top and got["header"] < 2 * tallest, got
    # nothing past the right edge, nothing over its neighbour
    lefts = sorted(got["items"], key=lambda i: i[1])
    assert lefts[-1][3] <= got["width"], got
    assert all(a[3] <= b[1] + 0.5 for a, b in zip(lefts, lefts[1:], strict=False)), got
    # the model's name is whole
    assert page.evaluate("(() => { const e = document.querySelector('.fx-model'); return e.scrollWidth <= e.clientWidth + 1; })()")
    assert "GPT2LMHeadModel" in (page.text_content(".fx-model") or "")
    if name in ("graph", "backward"):
        assert ("phase" in names) == (name == "backward") and ("scale" in names) == (name == "backward")
    # what sits behind ⋯ is there when it is opened, and works from there
    assert page.locator("[data-ref=theme]").is_hidden()
    page.click("[data-ref=more] > summary")
    for ref in ("exportSvg", "exportPng", "links", "theme"):
        assert page.locator(f"[data-ref={ref}]").is_visible(), ref
    page.click("[data-ref=theme]")  # auto -> light
    assert page.get_attribute("#fxviz-app", "data-theme") == "light"
    page.keyboard.press("Escape")
    assert page.locator("[data-ref=theme]").is_hidden()
    r.shot(f"toolbar-{name}")
    assert r.errors == []
    r.close()
