"""Model Explorer's load time next to fxviz's report (bench/report.py --model-explorer VENV): its
server (``model-explorer FILE.pt2``, from the ``ai-edge-model-explorer`` package in a venv of
its own) is started on a model saved with ``torch.export.save``, the page is opened in headless
Chromium, and the time is taken from navigation to the graph drawn (its node count shown and its
canvas on the page). A model its adapter cannot convert is reported with the server's error."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

ARGS = ["--no-sandbox", "--use-angle=swiftshader", "--enable-unsafe-swiftshader", "--ignore-gpu-blocklist"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


def save_pt2(name: str, path: Path) -> Path:
    """The model saved as .pt2: plain torch.export (Model Explorer's adapter loads it with
    torch.export.load), outputs as tuples so that the file deserialises without transformers."""
    import torch

    from bench._common import gpt2
    from fxviz import examples

    if name == "cnn":
        model, args = examples.cnn()
        kwargs: dict[str, Any] = {}
    else:
        model, args = gpt2(int(name.split("-")[1]), seq=16)
        kwargs = {"use_cache": False, "return_dict": False}
    torch.export.save(torch.export.export(model, args, kwargs), path)
    return path


def load_time(venv: Path, pt2: Path, reps: int = 3, timeout_s: float = 180) -> dict[str, Any]:
    """Median seconds from navigation to the graph drawn, or ``{"error": ...}``."""
    from playwright.sync_api import sync_playwright

    port = free_port()
    log = pt2.with_suffix(".me.log")
    server = subprocess.Popen([str(venv / "bin" / "model-explorer"), str(pt2), "--no_open_in_browser", "--port", str(port)],
                              stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        url = f"http://localhost:{port}/?data=" + quote(f'{{"models": [{{"url": "{pt2}"}}]}}')
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                socket.create_connection(("localhost", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        times = []
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
            for _ in range(reps):
                page = b.new_page(viewport={"width": 1600, "height": 1000})
                page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("http://localhost") else r.abort())
                t0 = time.perf_counter()
                page.goto(url)
                try:
                    page.wait_for_function("/\\b\\d+ nodes\\b/.test(document.body.innerText) && document.querySelector('canvas')",
                                           timeout=timeout_s * 1000)
                except Exception:  # noqa: BLE001 (the server's log says why)
                    errors = [ln for ln in log.read_text(errors="replace").splitlines() if "Error" in ln]
                    b.close()
                    return {"error": errors[-1][:200] if errors else f"no graph after {timeout_s:.0f} s"}
                times.append(time.perf_counter() - t0)
                page.close()
            b.close()
        return {"seconds": sorted(times)[len(times) // 2]}
    finally:
        server.terminate()
        server.wait(timeout=30)
