"""The report draws its first view before the page has read the second block of its data
(``fxviz.render.html.split_view_model``: each node's attributes, the values of the overlays it
does not open with), and what needs that block waits for it: a node selected meanwhile shows
its attributes once the block is read, a colouring chosen meanwhile is applied then. The page is
served over a local HTTP connection that holds the second block back until the test lets it go."""

from __future__ import annotations

import http.server
import threading
from typing import Any

import pytest

import fxviz
from fxviz import examples
from fxviz.render.html import to_html

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("bundle")]

#: Where the page's first block ends and the script is told so.
EVENT = '<script>document.dispatchEvent(new Event("fxviz-data"))</script>'


class HeldPage:
    """A local server of one page that sends it up to `EVENT`, then waits for `release`."""

    def __init__(self, text: str) -> None:
        cut = text.index(EVENT) + len(EVENT)
        head, tail = text[:cut].encode(), text[cut:].encode()
        self.release = threading.Event()
        release = self.release

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(head) + len(tail)))
                self.end_headers()
                self.wfile.write(head)
                self.wfile.flush()
                release.wait(60)
                self.wfile.write(tail)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/report.html"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_first_view_before_the_second_block_and_details_and_colours_after_it(browser: Any) -> None:
    m, a = examples.cnn()
    g = fxviz.capture(m, a)
    conv = next(i for i, n in enumerate(g.nodes) if n.name == "conv2d")
    assert g.nodes[conv].attrs["padding"] == [1, 1]
    # attributes are one text the page cuts by length: a character outside the BMP (two UTF-16
    # units) before conv2d's must not shift them
    g.nodes[0].attrs = {"note": "\U0001F600 é"}
    held = HeldPage(to_html(g))
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    page.on("console", lambda msg: msg.type in ("error", "warning") and errors.append(msg.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(held.url, wait_until="commit")
        page.wait_for_selector("#fxviz-app[data-ready=true]", timeout=60_000)
        # drawn while the rest of the page is held back, and busy until it comes
        assert page.evaluate("document.readyState") == "loading"
        assert page.evaluate("document.getElementById('fxviz-later')") is None
        assert page.locator("[data-ref=viewport] .fx-leaf").count() > 0
        assert page.get_attribute("#fxviz-app", "data-busy") == "true"
        # a node selected and a colouring chosen now wait for the second block
        page.evaluate(f"fxvizReport.viewer.select('n{conv}', false)")
        page.select_option("[data-ref=overlay]", "params")
        page.wait_for_timeout(200)
        assert page.locator("[data-ref=details] dt").count() == 0
        assert page.evaluate("fxvizReport.look.current") is None
        held.release.set()
        page.wait_for_selector("#fxviz-app:not([data-busy])", timeout=60_000)
        rows = page.eval_on_selector_all("[data-ref=details] dt", "els => els.map(e => [e.textContent, e.nextElementSibling.textContent])")
        found = dict(rows)
        assert found["name"] == "conv2d"
        assert "padding[1,1]" in found["attributes"].replace(" ", "")
        # 16 * 3 * 3 * 3 + 16: the node's own count (first block) and the params overlay's value
        # (second block)
        assert ["parameters", "448"] in rows and ["parameters", "448 params"] in rows
        assert page.evaluate("fxvizReport.look.current.name") == "params"
        assert page.get_attribute("#fxviz-app", "data-overlay") == "params"
        assert errors == []
    finally:
        page.close()
        held.close()
