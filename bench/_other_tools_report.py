"""Driver for bench/report.py, run in bench/.venv (where torchvista and torchview live): build one
model the way bench/report.py does and time each tool writing its report, once after a warm-up run.
Prints one JSON line: ``{tool: {"seconds": s, "bytes": n} | {"error": "Type: message"}}``.

    bench/.venv/bin/python bench/_other_tools_report.py gpt2-12 --out-dir /tmp/x

Models run on CPU with random weights: neither tool traces a model on ``meta``. torchview draws
with ``expand_nested=True`` and renders SVG through Graphviz; torchvista writes its HTML with
``trace_model(export_path=...)``. A model with transformers' cache gets ``use_cache=False`` for
torchview, which fails on ``DynamicCache`` outputs (noted in the result).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import gpt2, pin_threads, quiet_transformers  # noqa: E402


def build(name: str) -> tuple[Any, tuple[Any, ...]]:
    if name == "cnn":
        from fxviz import examples

        return examples.cnn()
    layers = int(name.split("-")[1])
    return gpt2(layers, seq=16, device="cpu")


def run_torchview(model: Any, args: tuple[Any, ...], out: Path) -> Path:
    from torchview import draw_graph

    kwargs = {"use_cache": False} if getattr(getattr(model, "config", None), "use_cache", False) else {}
    graph = draw_graph(model, input_data=list(args), expand_nested=True, **kwargs)
    return Path(graph.visual_graph.render(filename=str(out / "torchview"), format="svg", cleanup=True))


def run_torchvista(model: Any, args: tuple[Any, ...], out: Path) -> Path:
    from torchvista import trace_model

    path = out / "torchvista.html"
    with contextlib.redirect_stdout(io.StringIO()):  # it displays an HTML object as it goes
        trace_model(model, args, export_path=str(path))
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--tools", default="torchview,torchvista")
    opts = ap.parse_args()
    pin_threads(1)
    quiet_transformers()
    model, args = build(opts.model)
    out = Path(opts.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tools = {"torchview": run_torchview, "torchvista": run_torchvista}
    result: dict[str, Any] = {}
    for name in opts.tools.split(","):
        try:
            tools[name](model, args, out)  # warm-up
            t0 = time.perf_counter()
            path = tools[name](model, args, out)
            result[name] = {"seconds": time.perf_counter() - t0, "bytes": os.path.getsize(path)}
            if name == "torchview" and getattr(getattr(model, "config", None), "use_cache", False):
                result[name]["note"] = "use_cache=False"
        except BaseException as e:  # noqa: BLE001 (RecursionError and friends are results here)
            tb = traceback.extract_tb(e.__traceback__)
            where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
            result[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}{where}"}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
