"""Resident memory a capture borrows and gives back (issue 9): a deep LLaMA-shaped decoder (hidden 64,
random weights, CPU, input (1, 16)) captured by ``fxviz.capture(method="export")``, next to a bare
``torch.export.export`` of the same model.

    .venv/bin/python bench/memory.py [--layers 300,1200] [--out bench/results/memory.json]

Each measurement runs in a fresh process of its own, so that nothing one leaves behind is counted
against another. In it, the model is built and run once (``start`` is the resident size then,
``VmRSS`` of ``/proc/self/status``), the peak is reset (``/proc/self/clear_refs``), the capture runs
(``peak``: ``VmHWM``), ``after`` is the resident size with the result kept, ``after del`` once the
result is deleted and collected. ``held %`` = (after del − start) / start: the target is ≤ 10%.

Measured on the shared 2-core CPU box (torch 2.13, transformers 4.x), MB:

| layers | tool | ops/nodes | start | peak | after | after del | held % (after − start) | held % after del |
|---:|---|---:|---:|---:|---:|---:|---:|---:|
| 100 | fxviz, before ``gc.collect(0)`` | 6951 | 363 | 558 | 522 | 517 | +44% | +42% |
| 100 | fxviz | 6951 | 363 | 558 | 500 | 500 | +38% | +38% |
| 100 | export | 7266 | 363 | 517 | 503 | 498 | +39% | +37% |
| 300 | fxviz | 20751 | 398 | 944 | 744 | 722 | +87% | +81% |
| 300 | export | 21666 | 398 | 777 | 736 | 714 | +85% | +79% |

fxviz now holds what bare export holds (~107 MB per 100 layers after its result is deleted), no more:
collecting the young generation at the end of a capture (the collector is paused while it runs)
took 22 MB off at 100 layers; ``malloc_trim(0)`` (already run) and ``torch._dynamo.reset()`` give
back < 2% more. Not yet within 10%: after ``del`` one export ``GraphModule`` with its FakeTensors
is still alive, reachable from no object the collector tracks (a C-level or untracked holder inside
torch; not an ``lru_cache``, not a thread-local). What is left is a symbolic attempt run in a child
process past a size (issue 9's own suggestion).
"""


from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _status(key: str) -> float:
    """A ``/proc/self/status`` memory figure in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{key} not in /proc/self/status (Linux only)")


def _reset_peak() -> None:
    """Reset ``VmHWM`` to the current resident size (Linux ≥ 4.0), so the peak is the capture's."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def child(tool: str, layers: int) -> dict[str, Any]:
    """One measurement in this (fresh) process."""
    sys.path.insert(0, ROOT)
    from bench._common import pin_threads

    pin_threads(1)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=layers, vocab_size=256, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval()
    args = (torch.randint(0, 256, (1, 16)),)
    with torch.no_grad():
        model(*args)
    import fxviz  # noqa: F401  (imported before "start": its import is not the capture's)
    import fxviz.api  # noqa: F401

    gc.collect()
    start = _status("VmRSS")
    _reset_peak()
    t0 = time.perf_counter()
    if tool.startswith("fxviz"):
        result: Any = fxviz.capture(model, args, method="export", isolate=tool == "fxviz")
        nodes = len(result.ops)
    else:
        # transformers' DynamicCache output stops bare export: without the cache, as bench/capture.py
        result = torch.export.export(model, args, {"use_cache": False}, strict=False)
        nodes = len(result.graph.nodes)
    seconds = time.perf_counter() - t0
    peak = _status("VmHWM")
    # the largest child's peak resident size (the attempt run apart; shared pages counted in full)
    child_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    gc.collect()
    after = _status("VmRSS")
    del result
    gc.collect()
    after_del = _status("VmRSS")
    return {"tool": tool, "layers": layers, "nodes": nodes, "seconds": seconds, "start": start, "peak": peak,
            "child_peak": child_peak, "after": after,
            "after_del": after_del, "held_pct": 100 * (after_del - start) / start}


def run_child(tool: str, layers: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", tool, "--layers", str(layers)],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| layers | tool | ops/nodes | capture s | start | peak | child peak | after | after del "
             "| held % (after − start) | held % after del |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        kept = 100 * (r["after"] - r["start"]) / r["start"]
        child = f"{r['child_peak']:.0f}" if r.get("child_peak") else "-"
        lines.append(f"| {r['layers']} | {r['tool']} | {r['nodes']} | {r['seconds']:.1f} | {r['start']:.0f} | "
                     f"{r['peak']:.0f} | {child} | "
                     f"{r['after']:.0f} | {r['after_del']:.0f} | {kept:+.0f}% | {r['held_pct']:+.0f}% |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--layers", default="300,1200")
    p.add_argument("--tools", default="fxviz,fxviz-here,export",
                   help="fxviz: symbolic attempts apart (the default for deep models); fxviz-here: isolate=False")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.child, int(a.layers))))
        return
    rows = [run_child(tool, int(n)) for n in a.layers.split(",") for tool in a.tools.split(",")]
    print(table(rows))
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
