"""Pipeline cost: fxviz.pipeline (export -> decompose) next to the passes themselves, same run.

    .venv/bin/python bench/pipeline.py [--models gpt2,gpt2-48] [--reps N] [--out results.json]

For each model (GPT-2 from its default config, random weights, ``input_ids`` of shape (1, 128)),
in interleaved rounds after one warm-up round, torch pinned to one thread:

- ``passes``: ``torch.export.export(NormalizedModel(model, flat, box), flat.tensors)`` then
  ``run_decompositions()``: exactly the passes fxviz runs (fxviz/analyze/pipeline/run.py), so the
  difference is fxviz's own work (a graph per stage, the diff, provenance);
- ``passes (gc paused)``: the same with the cyclic garbage collector paused;
- ``fxviz``: ``fxviz.pipeline(model, args, numbers=False)``, end to end;
- ``fxviz + numbers``: ``fxviz.pipeline(model, args)`` (each stage run and compared with eager);
- ``forward``: one eager forward under ``no_grad``, the unit the numbers are measured in.

``overhead %`` = (fxviz - passes) / passes on the medians (target: at most 25%). fxviz pauses the
cyclic garbage collector while it runs, as a capture does, which alone makes tracing faster; so
``vs gc paused %`` compares with the passes run with the collector paused too (the strict number),
and ``paired %`` (the median of per-round ratios) and ``cpu %`` (process CPU time) use that one. ``numbers, forwards/stage`` = (fxviz + numbers - fxviz) / forward /
stages (target: at most 1; the eager reference forward is counted in it); ``check alone`` is what
the pipeline itself timed for each stage's run and comparison, in forwards.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from _common import (
    environment,
    fmt_s,
    gpt2,
    med,
    pin_threads,
    quiet_transformers,
    round_robin,
    table,
    write_json,
)


def bench_model(label: str, layers: int, reps: int) -> dict[str, Any]:
    import torch

    from fxviz.analyze.pipeline import pipeline
    from fxviz.torchbridge.normalize import NormalizedModel, flatten_inputs
    from fxviz.torchbridge.run import gc_paused

    model, args = gpt2(n_layer=layers)

    def passes() -> Any:
        flat = flatten_inputs(model, args, {})
        ep = torch.export.export(NormalizedModel(model, flat, {}), flat.tensors)
        return ep.run_decompositions()

    def passes_gc_paused() -> Any:
        with gc_paused():
            return passes()

    def forward() -> Any:
        with torch.no_grad():
            return model(*args)

    fns: dict[str, Callable[[], Any]] = {
        "passes": passes,
        "passes (gc paused)": passes_gc_paused,
        "fxviz": lambda: pipeline(model, args, numbers=False),
        "fxviz + numbers": lambda: pipeline(model, args),
        "forward": forward,
    }
    cpu: dict[str, list[float]] = {}
    times = round_robin(fns, reps=reps, warmup=1, cpu=cpu)
    p = pipeline(model, args)
    stages = len(p.stages)
    res: dict[str, Any] = {
        "model": label,
        "reps": reps,
        "times_s": times,
        "cpu_s": cpu,
        **{f"{k}_s": med(v) for k, v in times.items()},
        "stages": stages,
        "stage_seconds": {s.name: s.seconds for s in p.stages},
        "ops": {s.name: sum(s.ops_after.values()) for s in p.stages},
        "max_abs": {s.name: s.numbers.max_abs if s.numbers else None for s in p.stages},
    }
    res["overhead"] = res["fxviz_s"] / res["passes_s"] - 1
    strict = "passes (gc paused)"
    res["overhead_strict"] = res["fxviz_s"] / res[f"{strict}_s"] - 1
    res["overhead_paired"] = med([f / e for f, e in zip(times["fxviz"], times[strict], strict=True)]) - 1
    res["overhead_cpu"] = med(cpu["fxviz"]) / med(cpu[strict]) - 1
    res["numbers_s"] = res["fxviz + numbers_s"] - res["fxviz_s"]
    res["numbers_forwards_per_stage"] = res["numbers_s"] / res["forward_s"] / stages
    # the stage checks alone, as the pipeline timed them (the run and the comparison; not eager's forward)
    res["check_forwards_per_stage"] = sum(s.numbers.seconds for s in p.stages if s.numbers) / res["forward_s"] / stages
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt2,gpt2-48", help="comma-separated subset of gpt2,gpt2-48")
    ap.add_argument("--reps", type=int, default=None, help="measured rounds (default: 5 GPT-2 small, 2 for 48 layers)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="also write the results as JSON to this path")
    ns = ap.parse_args(argv)
    pin_threads(ns.threads)
    quiet_transformers()
    models = {"gpt2": ("GPT-2 small (12 layers), seq 128", 12, 5), "gpt2-48": ("GPT-2 48 layers, seq 128", 48, 2)}
    results = []
    t0 = time.perf_counter()
    for key in ns.models.split(","):
        label, layers, reps = models[key.strip()]
        print(f"... {label}", file=sys.stderr, flush=True)
        results.append(bench_model(label, layers, ns.reps or reps))
    rows = [[
        r["model"], fmt_s(r["passes_s"]), fmt_s(r["passes (gc paused)_s"]), fmt_s(r["fxviz_s"]),
        f"{r['overhead'] * 100:+.1f}%", f"{r['overhead_strict'] * 100:+.1f}%",
        f"{r['overhead_paired'] * 100:+.1f}%", f"{r['overhead_cpu'] * 100:+.1f}%", fmt_s(r["fxviz + numbers_s"]),
        fmt_s(r["forward_s"]), f"{r['numbers_forwards_per_stage']:.2f}", f"{r['check_forwards_per_stage']:.2f}",
        str(r["reps"]),
    ] for r in results]
    print(f"\n## Pipeline (export -> decompose): fxviz vs the passes alone ({ns.threads} thread, medians)\n")
    print(table(["model", "passes", "passes, gc paused", "fxviz", "overhead %", "vs gc paused %", "paired %", "cpu %",
                 "fxviz + numbers", "forward", "numbers, forwards/stage", "check alone, forwards/stage", "reps"], rows))
    print("\nStages (one run with numbers): " + "; ".join(
        f"{r['model'].split(',')[0]}: " + ", ".join(
            f"{k} {fmt_s(v)}, {r['ops'][k]} ops, max abs {r['max_abs'][k]:.2g}" for k, v in r["stage_seconds"].items())
        for r in results))
    env = environment()
    print(f"\n{env} — total {time.perf_counter() - t0:.0f} s")
    write_json(ns.out, {"environment": env, "pipeline": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
