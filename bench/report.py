"""Benchmark of the HTML report (issue 10): file size, and in headless Chromium (1600x1000) the
time to first paint, to open a box (a toggle: the folded run, then one block, and one block while
48 are open), to open everything (expand-all, where the model is small enough for it to be
sensible), to jump to a search hit deep in the model, and the page's JavaScript heap.

    .venv/bin/python bench/report.py [--models gpt2-12,gpt2-48,llama-80,aten-12,aten-48,aten-400,aten-1200]
        [--reps 3] [--no-others] [--out bench/results/report.json]

Models: GPT-2 small (12 layers), a 48-layer GPT-2 and the 80-layer LLaMA-70B shape, captured on
``meta`` with ``method="export"``; LLaMA-shaped decoders of 12, 48, 400 and 1,200 layers (hidden
64) captured with ``method="eager-aten"`` (the 1,200-layer one has ~100,000 nodes).

Figures come from the Performance API marks the report sets: ``fxviz:first-paint`` (navigation
start to the first view on screen: reading the file up to the end of the data's first block,
parsing it, building the model, the first layout; the page reads the second block after),
``fxviz:expand`` (a double-click to the frame after the drawing changed), ``fxviz:expand-all``,
``fxviz:go`` (the search's Enter to the hit drawn and selected; the hit is an op of the middle
layer's attention, behind the windowed run's ``⋯`` box). Heap: the page's ``JSHeapUsedSize``
after a garbage collection (the layout worker's own heap is not included).

torchview and torchvista run in ``bench/.venv`` (``bash bench/setup.sh``) where it exists.
``--model-explorer VENV`` also times Model Explorer loading the same models as ``.pt2``
(``python -m venv VENV && VENV/bin/pip install ai-edge-model-explorer``; torch from the
project's venv will do, e.g. through a .pth file; see bench/_model_explorer.py).
Targets: first paint under 1.5 s, a toggle or search jump under 300 ms at 100,000 nodes; a
toggle under 150 ms with 48 blocks open and expand-all of GPT-2 small under 2 s; heap under
1 GB; file size linear in nodes.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import environment, fmt_s, med, pin_threads, quiet_transformers, table, write_json  # noqa: E402
from bench._report_others import other_tools  # noqa: E402

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
ALL = ["gpt2-12", "gpt2-48", "llama-80", "aten-12", "aten-48", "aten-400", "aten-1200"]
#: expand-all is measured up to this many nodes; beyond, it opens boxes until 20,000 items are drawn
EXPAND_ALL_NODES = 12_000


def decoder(layers: int) -> tuple[Any, tuple[Any, ...]]:
    """A LLaMA-shaped decoder, hidden 64, ``layers`` layers, random weights, input (1, 16)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=layers, vocab_size=256, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).eval(), (torch.randint(0, 256, (1, 16)),)


def capture(name: str) -> Any:
    import fxviz
    from bench._common import gpt2
    from tests.report_models import llama_80_graph

    if name.startswith("gpt2-"):
        model, args = gpt2(int(name.split("-")[1]), seq=16, device="meta")
        return fxviz.capture(model, args, method="export")
    if name == "llama-80":
        return llama_80_graph()
    model, args = decoder(int(name.split("-")[1]))
    return fxviz.capture(model, args, method="eager-aten")


def last(page: Any, name: str) -> float:
    return float(page.evaluate(f"performance.getEntriesByName('{name}', 'measure').at(-1).duration"))


def settle(page: Any) -> None:
    page.wait_for_selector("#fxviz-app:not([data-busy])", timeout=120_000)


def toggle(page: Any, key: str) -> float:
    """Double-click box `key` and return the fxviz:expand time."""
    n = page.evaluate("performance.getEntriesByName('fxviz:expand').length")
    page.locator(f'[data-ref=viewport] [data-key="{key}"]').first.dispatch_event("dblclick")
    page.wait_for_function(f"performance.getEntriesByName('fxviz:expand').length > {n}", timeout=120_000)
    settle(page)
    return last(page, "fxviz:expand")


def heap_mb(cdp: Any) -> float:
    cdp.send("HeapProfiler.collectGarbage")
    metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    return float(metrics["JSHeapUsedSize"]) / 2**20


def one_round(browser: Any, path: Path, target: str, nodes: int) -> dict[str, float]:
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    cdp = page.context.new_cdp_session(page)
    cdp.send("Performance.enable")
    page.goto(path.as_uri())
    page.wait_for_selector("#fxviz-app[data-ready=true]", timeout=120_000)
    out: dict[str, float] = {"first_paint_ms": last(page, "fxviz:first-paint"), "heap_first_mb": heap_mb(cdp)}
    run = page.evaluate("fxvizReport.model.groups.findIndex(g => g.run)")
    if run >= 0:
        # the folded run, then the ⋯ box of a windowed run, then one block inside
        page.evaluate(f"fxvizReport.viewer.go('g{run}', {{mark: false}})")
        settle(page)
        out["toggle_run_ms"] = toggle(page, f"g{run}")
        more = page.evaluate(f"(fxvizReport.model.items({run}).find(k => fxvizReport.model.kind(+k.slice(1)) === 'more') || '')")
        if more:
            out["toggle_more_ms"] = toggle(page, more)
        members = page.evaluate(f"""(() => {{ const m = fxvizReport.model; const out = [];
            const walk = (c) => {{ for (const k of m.items(c)) {{ if (k[0] !== 'g') continue; const g = +k.slice(1);
              if (m.kind(g) === 'more') {{ if (m.expanded.has(g)) walk(g); }} else out.push(k); }} }};
            walk({run}); return out; }})()""")
        out["toggle_block_ms"] = toggle(page, members[min(2, len(members) - 1)])
        if len(members) >= 48:
            for key in members[:48]:
                if not page.evaluate(f"fxvizReport.model.expanded.has({key[1:]})"):
                    toggle(page, key)
            times = [toggle(page, members[3]) for _ in range(6)]  # close and open one of the 48
            out["toggle_48_open_ms"] = med(times)
            out["items_per_toggle_48_open"] = page.evaluate("fxvizReport.viewer.engine.last.items")
    # a search jump to a node deep in the last layer
    page.evaluate("fxvizReport.viewer.collapseAll()")
    settle(page)
    page.fill("[data-ref=search]", target)
    page.wait_for_selector(".fx-results li[data-key]", timeout=60_000)
    n = page.evaluate("performance.getEntriesByName('fxviz:go').length")
    page.press("[data-ref=search]", "Enter")
    page.wait_for_function(f"performance.getEntriesByName('fxviz:go').length > {n}", timeout=120_000)
    settle(page)
    out["search_jump_ms"] = last(page, "fxviz:go")
    if nodes <= EXPAND_ALL_NODES:
        page.evaluate("fxvizReport.viewer.collapseAll()")
        settle(page)
        page.click("[data-action=expand]")
        page.wait_for_function("performance.getEntriesByName('fxviz:expand-all').length > 0", timeout=120_000)
        settle(page)
        out["expand_all_ms"] = last(page, "fxviz:expand-all")
    out["heap_end_mb"] = heap_mb(cdp)
    page.close()
    return out


def browser_rounds(path: Path, target: str, nodes: int, reps: int) -> dict[str, list[float]]:
    from playwright.sync_api import sync_playwright

    rounds: dict[str, list[float]] = {}
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        for _ in range(reps):
            for k, v in one_round(b, path, target, nodes).items():
                rounds.setdefault(k, []).append(v)
        b.close()
    return rounds


def ms(x: float | None) -> str:
    return "" if x is None else f"{x:,.0f} ms"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(ALL))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-others", action="store_true", help="skip torchview and torchvista")
    ap.add_argument("--model-explorer", type=Path, help="a venv with ai-edge-model-explorer installed")
    ap.add_argument("--out")
    opts = ap.parse_args()
    pin_threads(1)
    quiet_transformers()
    from fxviz.render.html import to_html

    tmp = Path(tempfile.mkdtemp(prefix="fxviz-bench-report-"))
    rows, results = [], {}
    for name in opts.models.split(","):
        t0 = time.perf_counter()
        g = capture(name)
        cap = time.perf_counter() - t0
        t0 = time.perf_counter()
        text = to_html(g, tmp / f"{name}.html")
        gen = time.perf_counter() - t0
        size = len(text.encode())
        # the view-model's two blocks (html.split_view_model)
        data = sum(len(m.group(1).encode()) for m in re.finditer(r'id="fxviz-(?:data|later)">(.*?)</script>', text, re.S))
        # a node of the middle layer's attention, found by its name: behind the ⋯ box of a
        # windowed run, and in one of its parts when the model has more than 120 layers
        ops = [n for n in g.ops if "attn" in n.module] or g.ops
        target = ops[len(ops) // 2].name
        r: dict[str, Any] = {"nodes": len(g.nodes), "capture_s": cap, "to_html_s": gen, "bytes": size, "data_bytes": data,
                             "bytes_per_node": data / len(g.nodes), "target": target}
        r.update({k: med(v) for k, v in browser_rounds(tmp / f"{name}.html", target, len(g.nodes), opts.reps).items()})
        if not opts.no_others and name in ("gpt2-12", "gpt2-48"):
            r["others"] = other_tools(name, tmp)
        if opts.model_explorer and name == "gpt2-12":
            from bench._model_explorer import load_time, save_pt2

            r.setdefault("others", {})["model explorer"] = load_time(opts.model_explorer, save_pt2(name, tmp / f"{name}.pt2"))
        results[name] = r
        rows.append([name, f"{r['nodes']:,}", f"{size / 1e6:.2f} MB", f"{r['bytes_per_node']:.0f}", fmt_s(gen),
                     ms(r.get("first_paint_ms")), ms(r.get("toggle_run_ms")), ms(r.get("toggle_block_ms")),
                     ms(r.get("toggle_48_open_ms")), ms(r.get("expand_all_ms")), ms(r.get("search_jump_ms")),
                     f"{r['heap_end_mb']:.0f} MB"])
        print(f"{name}: {r}", file=sys.stderr, flush=True)
        del g
    print(table(["model", "nodes", "file", "B/node", "to_html", "first paint", "open run", "open block",
                 "toggle, 48 open", "expand-all", "search jump", "JS heap"], rows))
    others = {k: v["others"] for k, v in results.items() if "others" in v}
    if others:
        print("\nother tools (time to write their report, file size):")
        for k, v in others.items():
            cells = [f"{tool}: {res['error']}" if "error" in res
                     else f"{tool}: {fmt_s(res['seconds'])}" + (f", {res['bytes'] / 1e6:.2f} MB" if "bytes" in res else "")
                     for tool, res in v.items()]
            print(f"  {k}: " + "; ".join(cells))
    print(f"\nmedians of {opts.reps} rounds, Chromium headless at 1600x1000; files in {tmp}")
    write_json(opts.out, {"env": environment(), "results": results})


if __name__ == "__main__":
    main()
