"""What the browser tests of the report share: opening a page in Chromium and watching it for
errors and network, waiting for the layout (it runs in a worker), reading what is drawn, and
writing a page from a view-model built or edited by hand (the contract of WAVE2.md, before and
besides what fxviz writes itself). Screenshots go to artifacts/ (git-ignored)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fxviz.ir import Graph
from fxviz.render.html import to_html
from tests.viewmodel import FIRST, LATER, page_data

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


def page_from_data(graph: Graph, path: Path, edit: Any = None, data: dict[str, Any] | None = None) -> Path:
    """Write ``graph``'s report to ``path`` with its view-model changed by ``edit(data)`` (or
    replaced by ``data``): the same template, script and escaping as ``to_html``, the view-model
    in one block (the script reads a page without the second block as having it all in the
    first)."""
    text = to_html(graph)
    if edit is None and data is None:
        path.write_text(text, encoding="utf-8")
        return path
    if data is None:
        data = page_data(text)
        edit(data)
    raw = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    safe = raw.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
    text = LATER.sub("", FIRST.sub(lambda m: m.group(1) + safe + m.group(3), text, count=1), count=1)
    path.write_text(text, encoding="utf-8")
    return path


# the smallest on-screen size of every label the graph shows that lies (at least partly) on
# screen: font size times the zoom of the element's own transform
LABEL_SIZES = """svg => {
  const box = svg.getBoundingClientRect();
  let min = Infinity, smallest = null, count = 0;
  for (const t of svg.querySelectorAll('text')) {
    if (!t.textContent.trim()) continue;
    const r = t.getBoundingClientRect();
    if (!r.width || r.bottom < box.top || r.top > box.bottom || r.right < box.left || r.left > box.right) continue;
    const px = parseFloat(getComputedStyle(t).fontSize) * t.getScreenCTM().a;
    count += 1;
    if (px < min) { min = px; smallest = t.textContent; }
  }
  return {min, smallest, count};
}"""

# the screen rectangle of every drawn item, by key
RECTS = """root => Object.fromEntries([...root.querySelectorAll('.fx-leaf, .fx-cluster')].map(e => {
  const r = (e.classList.contains('fx-cluster') ? e.querySelector(':scope > .fx-frame') : e.querySelector('rect:not(.fx-stack)')).getBoundingClientRect();
  return [e.dataset.key, [r.x, r.y, r.width, r.height]];
}))"""


class ReportPage:
    """One opened report: the page, and everything it logged, asked for or popped up."""

    def __init__(self, browser: Any, path: Path, *, width: int = 1400, height: int = 900, hash: str = "",
                 color_scheme: str = "light") -> None:
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.page = browser.new_page(viewport={"width": width, "height": height}, color_scheme=color_scheme,
                                     accept_downloads=True)
        self.page.on("console", lambda m: m.type in ("error", "warning") and self.errors.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.on("request", lambda r: self.requests.append(r.url))
        # anything but the file itself (and the worker's blob) is refused, and counted above
        self.page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(("file:", "blob:")) else route.abort())
        self.page.goto(path.as_uri() + hash)
        self.page.wait_for_selector("#fxviz-app[data-ready=true]", timeout=60_000)
        self.settle()

    def settle(self) -> None:
        """Wait until no layout is under way (the worker answered and the drawing is done)."""
        self.page.wait_for_selector("#fxviz-app:not([data-busy])", timeout=60_000)

    def js(self, expr: str) -> Any:
        """Evaluate ``expr`` (a promise is awaited), then wait for the drawing to settle."""
        out = self.page.evaluate(expr)
        self.settle()
        return out

    def keys(self) -> set[str]:
        """Keys of the drawn closed items (nodes and closed boxes)."""
        return set(self.page.eval_on_selector_all("[data-ref=viewport] .fx-leaf", "els => els.map(e => e.dataset.key)"))

    def open_paths(self) -> set[str]:
        return set(self.page.eval_on_selector_all("[data-ref=viewport] .fx-cluster", "els => els.map(e => e.dataset.path)"))

    def layouts(self) -> int:
        return int(self.page.get_attribute("#fxviz-app", "data-layouts") or 0)

    def label_sizes(self) -> dict[str, Any]:
        return self.page.eval_on_selector("[data-ref=svg]", LABEL_SIZES)  # type: ignore[no-any-return]

    def rects(self) -> dict[str, list[float]]:
        return self.page.eval_on_selector("[data-ref=viewport]", RECTS)  # type: ignore[no-any-return]

    def details(self) -> dict[str, str]:
        """The details panel as {row title: row text}; a title met twice (an overlay's row under
        ``overlays`` named like a row of the panel's own, ``parameters``) keeps the panel's own."""
        rows = self.page.eval_on_selector_all(
            "[data-ref=details] dt", "els => els.map(e => [e.textContent, e.nextElementSibling.textContent])")
        out: dict[str, str] = {}
        for title, text in rows:
            out.setdefault(title, text)
        return out

    def dblclick(self, selector: str) -> None:
        self.page.locator(selector).first.dispatch_event("dblclick")
        self.settle()

    def shot(self, name: str) -> None:
        ARTIFACTS.mkdir(exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"report-{name}.png"))

    def close(self) -> None:
        """Close the page; fail if it logged an error, opened a dialog or asked the network."""
        errors, dialogs = self.errors, self.dialogs
        remote = [u for u in self.requests if not u.startswith(("file:", "blob:"))]
        self.page.close()
        assert errors == [], errors
        assert dialogs == []
        assert remote == []
