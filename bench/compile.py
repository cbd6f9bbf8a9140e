"""Compile-map cost: ``fxviz.compile_map`` against a bare ``torch.compile(model)(*args)`` first call,
same backend, same run.

    .venv/bin/python bench/compile.py [--reps N] [--models cnn,resnet,gpt2] [--backends aot_eager,inductor]
                                      [--threads N] [--cold] [--out results.json]

For each model and backend, in interleaved rounds (the order alternates) after one warm-up round,
with torch pinned to ``--threads`` threads (1 by default) and both sides under ``torch.no_grad()``
(as compile_map runs the model):

- ``bare``: ``torch._dynamo.reset()`` (Dynamo's caches cold), then
  ``torch.compile(model, backend=b)(*args)``: the first call (Dynamo traces, the backend compiles,
  the graph runs), then ``torch._dynamo.reset()`` again (as compile_map leaves Dynamo);
- ``fxviz``: ``fxviz.compile_map(model, args, backend=b)``, end to end (it resets Dynamo itself,
  compiles and runs once, traces the first input set eagerly, and builds the map).

``ratio`` = median process CPU time of fxviz / median of bare (``time.process_time``: blind to
the time a shared machine makes a process wait for a core); ``paired``: the median of the
per-round CPU ratios; ``wall``: the same ratio of wall-time medians, beside. Target (issue 18):
at most 1.10 on GPT-2 and ResNet-18 with aot_eager. ``parts`` is compile_map's own split of its wall time (the
compiled run, the eager trace, building the map). Inductor's on-disk caches are warm after the
warm-up round for both sides alike; ``--cold`` turns Inductor's FX graph cache off for both.
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


def build_resnet() -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """ResNet-18 as bench/tracer.py builds it (torchvision's layout, written out), 1x3x224x224."""
    from tracer import build_models

    model, args, _ = build_models(1)["resnet"]()
    return model, args, {}


MODELS: dict[str, tuple[str, Callable[[], tuple[Any, tuple[Any, ...], dict[str, Any]]]]] = {
    "cnn": ("seed CNN (fxviz.examples)", build_cnn),
    "resnet": ("ResNet-18 (by hand), 1x3x224x224", build_resnet),
    "gpt2": ("GPT-2 small, 12 layers, seq 128", build_gpt2),
}


def bench(name: str, backend: str, reps: int) -> dict[str, Any]:
    import torch
    import torch._dynamo as dynamo

    import fxviz

    label, build = MODELS[name]
    model, args, kwargs = build()

    def bare() -> Any:
        dynamo.reset()
        with torch.no_grad():
            out = torch.compile(model, backend=backend)(*args, **kwargs)
        dynamo.reset()
        return out

    def via_fxviz() -> Any:
        return fxviz.compile_map(model, args, kwargs, backend=backend)

    cpu: dict[str, list[float]] = {}
    times = round_robin({"bare": bare, "fxviz": via_fxviz}, reps=reps, warmup=1, cpu=cpu)
    cmap = via_fxviz()
    res: dict[str, Any] = {
        "model": label, "backend": backend, "reps": reps, "times_s": times, "cpu_s": cpu,
        "bare_cpu_s": med(cpu["bare"]), "fxviz_cpu_s": med(cpu["fxviz"]),
        "bare_s": med(times["bare"]), "fxviz_s": med(times["fxviz"]),
        "header": cmap.header(), "timings": cmap.timings,
    }
    res["ratio"] = res["fxviz_cpu_s"] / res["bare_cpu_s"]
    res["ratio_paired"] = med([f / b for f, b in zip(cpu["fxviz"], cpu["bare"], strict=True)])
    res["ratio_wall"] = res["fxviz_s"] / res["bare_s"]
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--models", default="cnn,resnet,gpt2")
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
    rows = [[r["model"], r["backend"], fmt_s(r["bare_cpu_s"]), fmt_s(r["fxviz_cpu_s"]), f"{r['ratio']:.3f}x",
             f"{r['ratio_paired']:.3f}x", f"{fmt_s(r['bare_s'])} / {fmt_s(r['fxviz_s'])} = {r['ratio_wall']:.3f}x",
             ", ".join(f"{k.removesuffix('_s')} {fmt_s(v)}" for k, v in r["timings"].items())] for r in results]
    print(table(["model", "backend", "bare cpu", "fxviz cpu", "ratio", "paired", "wall", "parts (wall)"], rows))
    write_json(a.out, {"environment": environment(), "cold": a.cold, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
