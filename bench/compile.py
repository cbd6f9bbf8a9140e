"""Compile-map cost: ``fxviz.compile_map`` next to a bare ``torch.compile`` first call plus one eager
trace, same run, same backend.

    .venv/bin/python bench/compile.py [--reps N] [--models cnn,gpt2] [--backends aot_eager,inductor]
                                      [--threads N] [--out results.json]

For each model and backend, in interleaved rounds after one warm-up round, with torch pinned to
``--threads`` threads and everything under ``torch.no_grad()`` (as compile_map runs):

- ``baseline``: ``torch._dynamo.reset()``, ``torch.compile(model, backend=b)(*args)`` (the first
  call: Dynamo traces, the backend compiles, the graph runs), then ``fxviz.capture(model, args,
  method="eager")`` (one eager trace with fxviz's passes): what a user pays to get the eager graph
  and the compiled model without the map;
- ``fxviz``: ``fxviz.compile_map(model, args, backend=b)``, end to end (it resets Dynamo itself).

``overhead %`` = (fxviz - baseline) / baseline on the medians; ``paired %``: the median of the
per-round ratios. Target (issue 12): at most 25%. Inductor's on-disk caches are warm after the
warm-up round for both sides alike (the numbers are of a warm cache, the common case when a user
re-runs an analysis); ``--cold`` turns Inductor's FX graph cache off for both.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable
from typing import Any

from _common import (
    build_cnn,
    build_gpt2,
    environment,
    fmt_s,
    med,
    pin_threads,
    quiet_transformers,
    round_robin,
    table,
    write_json,
)

MODELS: dict[str, tuple[str, Callable[[], tuple[Any, tuple[Any, ...], dict[str, Any]]]]] = {
    "cnn": ("seed CNN (fxviz.examples)", build_cnn),
    "gpt2": ("GPT-2 small, 12 layers, seq 128", build_gpt2),
}


def bench(name: str, backend: str, reps: int) -> dict[str, Any]:
    import torch
    import torch._dynamo as dynamo

    import fxviz

    label, build = MODELS[name]
    model, args, kwargs = build()

    def baseline() -> Any:
        dynamo.reset()
        with torch.no_grad():
            torch.compile(model, backend=backend)(*args, **kwargs)
        g = fxviz.capture(model, args, kwargs, method="eager")
        dynamo.reset()
        return g

    def via_fxviz() -> Any:
        return fxviz.compile_map(model, args, kwargs, backend=backend)

    cpu: dict[str, list[float]] = {}
    times = round_robin({"baseline": baseline, "fxviz": via_fxviz}, reps=reps, warmup=1, cpu=cpu)
    cmap = via_fxviz()
    res: dict[str, Any] = {
        "model": label, "backend": backend, "reps": reps, "times_s": times, "cpu_s": cpu,
        "baseline_s": med(times["baseline"]), "fxviz_s": med(times["fxviz"]),
        "header": cmap.header(), "timings": cmap.timings,
    }
    res["overhead"] = res["fxviz_s"] / res["baseline_s"] - 1
    res["overhead_paired"] = med([f / b for f, b in zip(times["fxviz"], times["baseline"], strict=True)]) - 1
    res["overhead_cpu"] = med(cpu["fxviz"]) / med(cpu["baseline"]) - 1
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--models", default="cnn,gpt2")
    ap.add_argument("--backends", default="aot_eager,inductor")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cold", action="store_true", help="Turn Inductor's FX graph cache off (both sides).")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    pin_threads(a.threads)
    quiet_transformers()
    if a.cold:
        import torch._inductor.config as inductor_config

        inductor_config.fx_graph_cache = False
    results = []
    for backend in a.backends.split(","):
        for name in a.models.split(","):
            with contextlib.redirect_stdout(sys.stderr):
                r = bench(name, backend, a.reps)
            results.append(r)
            print(f"{r['model']} / {backend}: {r['header']}", file=sys.stderr)
    rows = [[r["model"], r["backend"], fmt_s(r["baseline_s"]), fmt_s(r["fxviz_s"]), f"{100 * r['overhead']:+.1f}%",
             f"{100 * r['overhead_paired']:+.1f}%", f"{100 * r['overhead_cpu']:+.1f}%"] for r in results]
    print(table(["model", "backend", "compile + trace", "fxviz compile", "overhead", "paired", "cpu"], rows))
    write_json(a.out, {"environment": environment(), "cold": a.cold, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
