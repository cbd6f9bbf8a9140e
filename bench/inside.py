"""``compile_map(..., inside=True)`` (``fxviz compile --inside``) against a bare
``torch.compile(model)(*args)`` first call, Inductor, caches cold.

    .venv/bin/python bench/inside.py [--reps N] [--models resnet,gpt2] [--threads N] [--device cuda] [--out results.json]

Each measurement is its own process with a fresh ``TORCHINDUCTOR_CACHE_DIR`` (Inductor's on-disk
caches cold; FX graph and AOT Autograd caches miss alike on both sides) and
``TORCHINDUCTOR_COMPILE_THREADS=1`` (the C++ compiler runs as a child the process waits for, so
its CPU time is counted). Sides, in interleaved rounds (the order alternates):

- ``bare``: ``torch.compile(model)(*args)`` under ``torch.no_grad()``, the first call;
- ``inside``: ``fxviz.compile_map(model, args, backend="inductor", inside=True)``: the compiled
  run under torch's structured trace, the eager trace, the stages, the kernel map, and the kernels
  timed over :data:`fxviz.analyze.inside.live.ITERATIONS` warm iterations.

Measured inside the process around that one call: CPU time (``time.process_time`` plus the
children's ``RUSAGE_CHILDREN`` user+sys: the C++ compiler) and wall time. ``ratio`` = median CPU
of inside / median CPU of bare; ``wall`` the same for wall time. Target (issue 20): at most 1.25.
The share of post-grad ops mapped to a kernel is reported for each model. ``--device cuda`` runs
both sides on the GPU (Triton kernels; the bare side synchronises before its clock stops).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import environment, fmt_s, med, pin_threads, table, write_json

HERE = Path(__file__).resolve().parent


def build(name: str) -> tuple[Any, tuple[Any, ...]]:
    from _common import build_gpt2, quiet_transformers

    if name == "gpt2":
        quiet_transformers()
        model, args, _ = build_gpt2()
        return model, args
    from tracer import build_models

    model, args, _ = build_models(1)["resnet"]()
    return model, args


def one(name: str, side: str, threads: int, device: str = "cpu") -> dict[str, Any]:
    """One measurement in this process (the child)."""
    pin_threads(threads)
    import torch

    import fxviz

    model, args = build(name)
    model.eval()
    if device != "cpu":
        model = model.to(device)
        args = tuple(a.to(device) for a in args)

    def cpu() -> float:
        ch = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + ch.ru_utime + ch.ru_stime

    c0, w0 = cpu(), time.perf_counter()
    extra: dict[str, Any] = {}
    if side == "bare":
        with torch.no_grad():
            torch.compile(model)(*args)
        if device != "cpu":
            torch.cuda.synchronize()
    else:
        cm = fxviz.compile_map(model, args, backend="inductor", inside=True)
        assert cm.inside is not None
        extra = {"mapped": cm.inside.share_mapped, "kernels": len(cm.inside.kernels),
                 "graphs": len(cm.inside.graphs), "timed": cm.inside.timed, "summary": cm.inside.summary(),
                 "not_fused": len(cm.inside.not_fused)}
    return {"cpu": cpu() - c0, "wall": time.perf_counter() - w0, **extra}


def measure(name: str, side: str, threads: int, device: str = "cpu") -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fxviz-bench-inductor-") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TORCHINDUCTOR_COMPILE_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run([sys.executable, str(HERE / "inside.py"), "--one", name, side, "--threads", str(threads),
                               "--device", device],
                              capture_output=True, text=True, env=env, cwd=HERE, timeout=3600)
    if proc.returncode:
        raise SystemExit(f"{name} {side} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--models", default="resnet,gpt2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=None)
    ap.add_argument("--one", nargs=2, metavar=("MODEL", "SIDE"), default=None)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one[0], a.one[1], a.threads, a.device)))
        return
    rows, results = [], {}
    for name in a.models.split(","):
        runs: dict[str, list[dict[str, Any]]] = {"bare": [], "inside": []}
        for r in range(a.reps):
            for side in (("bare", "inside") if r % 2 == 0 else ("inside", "bare")):
                runs[side].append(measure(name, side, a.threads, a.device))
                print(name, side, runs[side][-1], file=sys.stderr)
        cpu = {s: med([x["cpu"] for x in v]) for s, v in runs.items()}
        wall = {s: med([x["wall"] for x in v]) for s, v in runs.items()}
        ins = runs["inside"][-1]
        results[name] = {"runs": runs, "ratio": cpu["inside"] / cpu["bare"], "wall_ratio": wall["inside"] / wall["bare"],
                         "mapped": ins["mapped"]}
        rows.append([name, fmt_s(cpu["bare"]), fmt_s(cpu["inside"]), f"{cpu['inside'] / cpu['bare']:.2f}x",
                     fmt_s(wall["bare"]), fmt_s(wall["inside"]), f"{wall['inside'] / wall['bare']:.2f}x",
                     f"{ins['mapped'] * 100:.1f}%", str(ins["kernels"])])
    print(table(["model", "bare cpu", "inside cpu", "ratio", "bare wall", "inside wall", "wall ratio",
                 "ops mapped", "kernels"], rows))
    write_json(a.out, {"environment": environment(), "results": results})


if __name__ == "__main__":
    main()
