"""Benchmark of the HTML report (issue 4): generation time and file size next to torchview (SVG)
and torchvista (HTML) on the same models in the same run, bytes per node, and, in headless
Chromium, time to first paint and to expand one module (Performance API marks the report sets:
``fxviz:first-paint`` from navigation start, ``fxviz:expand`` from the double-click's handler to
the frame after the re-drawn graph is painted; ``fxviz:layout`` is dagre's share of it).

    .venv/bin/python bench/report.py [--reps 3] [--no-others] [--no-llama] [--out bench/results/html.json]

Models: the CNN, GPT-2 small (12 layers), a 48-layer GPT-2 (``input_ids`` (1, 16)) and the
80-layer LLaMA-70B-shaped model. fxviz captures the transformers models on ``meta`` with
``method="export"``; ``capture+html`` is capture and report together, ``to_html`` the report alone.
torchview and torchvista run in ``bench/.venv`` (``bash bench/setup.sh``) through
``bench/_other_tools_report.py`` on CPU with random weights (neither traces a model on ``meta``);
their time covers tracing and writing the file, like fxviz's ``capture+html``. A tool that fails
shows ``n/a`` and the reason. Targets: first paint < 1.5 s, expand < 300 ms on the 48-layer GPT-2;
the LLaMA graph opens and expands.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import environment, fmt_s, med, pin_threads, quiet_transformers, table, timed, write_json  # noqa: E402

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
BENCH_PY = ROOT / "bench" / ".venv" / "bin" / "python"
OTHERS_TIMEOUT_S = 600


def browser_timings(path: Path, reps: int, block: str | None) -> dict[str, list[float]]:
    """First paint, then expanding the folded run of blocks, then one block inside it."""
    from playwright.sync_api import sync_playwright

    out: dict[str, list[float]] = {"first_paint_ms": [], "expand_ms": [], "layout_ms": [], "expand_block_ms": [],
                                   "collapse_ms": []}
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        for _ in range(reps):
            page = b.new_page(viewport={"width": 1400, "height": 900})
            page.goto(path.as_uri())
            page.wait_for_selector("#fxviz-app[data-ready=true]", timeout=60_000)
            out["first_paint_ms"].append(page.evaluate("performance.getEntriesByName('fxviz:first-paint')[0].duration"))
            steps = [(".fx-box.fx-run", "expand_ms")]
            if block:
                steps += [(f'.fx-box[data-path="{block}"]', "expand_block_ms"),
                          (f'.fx-cluster[data-path="{block}"] .fx-toggle', "collapse_ms")]
            for selector, key in steps:
                if page.locator(selector).count() == 0:
                    continue
                n = page.evaluate("performance.getEntriesByName('fxviz:expand').length")
                page.locator(selector).first.dispatch_event("click" if key == "collapse_ms" else "dblclick")
                page.wait_for_function(f"performance.getEntriesByName('fxviz:expand').length > {n}")
                out[key].append(page.evaluate("performance.getEntriesByName('fxviz:expand').at(-1).duration"))
                if key == "expand_ms":
                    out["layout_ms"].append(page.evaluate("performance.getEntriesByName('fxviz:layout').at(-1).duration"))
            page.close()
        b.close()
    return out


def other_tools(name: str, out_dir: Path) -> dict[str, Any]:
    """torchview and torchvista on model ``name``, in bench/.venv; ``{tool: result}``."""
    if not BENCH_PY.exists():
        reason = "bench/.venv missing: run bash bench/setup.sh"
        return {"torchview": {"error": reason}, "torchvista": {"error": reason}}
    cmd = [str(BENCH_PY), str(ROOT / "bench" / "_other_tools_report.py"), name, "--out-dir", str(out_dir / name)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=OTHERS_TIMEOUT_S, cwd=ROOT)
    except subprocess.TimeoutExpired:
        reason = f"timed out after {OTHERS_TIMEOUT_S} s"
        return {"torchview": {"error": reason}, "torchvista": {"error": reason}}
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        reason = f"driver failed (exit {r.returncode}): {r.stderr.strip().splitlines()[-1:] or ''}"
        return {"torchview": {"error": reason}, "torchvista": {"error": reason}}
    return json.loads(lines[-1])


def llama80() -> tuple[Any, tuple[Any, ...]]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=8192, intermediate_size=28672, num_attention_heads=64, num_key_value_heads=8,
                      num_hidden_layers=80, vocab_size=32000)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg).eval()
    return model, (torch.randint(0, 32000, (1, 16), device="meta"),)


def cell(r: dict[str, Any] | None) -> tuple[str, str]:
    """(time, size) cells of another tool's result."""
    if r is None:
        return "", ""
    if "error" in r:
        return f"n/a ({r['error'][:90]})", "n/a"
    note = f" ({r['note']})" if r.get("note") else ""
    return fmt_s(r["seconds"]) + note, f"{r['bytes'] / 1e6:.2f} MB"


def ms(x: float | None) -> str:
    return f"{x:.0f} ms" if x else ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-others", action="store_true", help="skip torchview and torchvista")
    ap.add_argument("--no-llama", action="store_true", help="skip the 80-layer LLaMA-70B-shaped model")
    ap.add_argument("--out")
    opts = ap.parse_args()
    pin_threads(1)
    quiet_transformers()
    import fxviz
    from bench._common import gpt2
    from fxviz import examples
    from fxviz.render.html import to_html

    models: dict[str, Any] = {
        "cnn": (examples.cnn, None),
        "gpt2-12": (lambda: gpt2(12, seq=16, device="meta"), "transformer.h.5"),
        "gpt2-48": (lambda: gpt2(48, seq=16, device="meta"), "transformer.h.5"),
    }
    if not opts.no_llama:
        models["llama-80"] = (llama80, "model.layers.5")
    rows, results = [], {}
    tmp = Path(tempfile.mkdtemp(prefix="fxviz-bench-html-"))
    for name, (build, block) in models.items():
        model, args = build()
        t0 = time.perf_counter()
        g = fxviz.capture(model, args, method="export")
        to_html(g)
        total = time.perf_counter() - t0
        times = [timed(lambda g=g: to_html(g))[0] for _ in range(opts.reps + 1)][1:]
        text = to_html(g, tmp / f"{name}.html")
        size = len(text.encode())
        data = len(re.search(r'id="fxviz-data">(.*?)</script>', text, re.S).group(1).encode())  # type: ignore[union-attr]
        r: dict[str, Any] = {"nodes": len(g.nodes), "capture_html_s": total, "gen_s": med(times), "bytes": size,
                             "data_bytes": data, "fixed_bytes": size - data, "bytes_per_node": data / len(g.nodes)}
        if name != "cnn":
            r.update({k: med(v) if v else None for k, v in browser_timings(tmp / f"{name}.html", opts.reps, block).items()})
        others = {} if opts.no_others or name == "llama-80" else other_tools(name, tmp)
        r["others"] = others
        results[name] = r
        tv, tv_size = cell(others.get("torchview")) if others else ("", "")
        vi, vi_size = cell(others.get("torchvista")) if others else ("", "")
        rows.append([name, f"{r['nodes']:,}", fmt_s(total), fmt_s(r["gen_s"]), f"{size / 1e6:.2f} MB",
                     f"{r['bytes_per_node']:.0f}", ms(r.get("first_paint_ms")), ms(r.get("expand_ms")),
                     ms(r.get("expand_block_ms")), ms(r.get("collapse_ms")), tv, tv_size, vi, vi_size])
        del model, g
    print(table(["model", "nodes", "fxviz capture+html", "fxviz to_html", "fxviz file", "B/node", "first paint",
                 "expand ×N", "expand block", "collapse block", "torchview SVG", "torchview file",
                 "torchvista HTML", "torchvista file"], rows))
    print(f"\nfixed part of an fxviz report (script, styles, template): {results['cnn']['fixed_bytes'] / 1e3:.0f} kB; "
          f"medians of {opts.reps} runs; files in {tmp}")
    write_json(opts.out, {"env": environment(), "results": results})


if __name__ == "__main__":
    main()
