"""Numerics cost: fxviz.numerics next to the two plain runs it stands for, and its peak memory next
to one forward.

    .venv/bin/python bench/numerics.py [--models gpt2,gpt2-48] [--sides dtype:bfloat16,export,compile:aot_eager]
                                       [--reps N] [--seq 128] [--out results.json]

Every measurement runs in a fresh subprocess (torch pinned to one thread), so the peak memory of
one does not hide in another's: the child builds the model, runs its work once to warm up, resets
the kernel's resident-set high-water mark (``/proc/self/clear_refs``; tracemalloc does not see
torch's CPU allocations), runs the work ``--reps`` times and reports the median wall time and the
peak RSS (``VmHWM``), with the RSS before the work (model built) as the baseline. The works:

- ``eager``: ``model(*args)`` under ``torch.no_grad()`` — the reference forward;
- ``dtype:bfloat16``: the forward of a bfloat16 copy of the model (the copy is made before the
  clock starts), ``autocast:bfloat16`` the forward under ``torch.autocast``;
- ``export``: ``torch.export.export`` of the model plus one run of ``ep.module()``: what running the
  model the other way costs (numerics must export too); ``export run`` the run alone;
- ``compile:aot_eager`` / ``compile:inductor``: the first call of ``torch.compile(model, backend=...)``
  (Dynamo reset before and after, so each call compiles; Inductor's on-disk caches are warm after
  the warm-up call, for this and for numerics alike);
- ``numerics SIDE``: ``fxviz.numerics(model, args, against=SIDE)``, end to end.

``--floor``: what the eager noise floor costs (:mod:`fxviz.analyze.numerics.floor`), in one process,
torch on one thread, interleaved rounds (``_common.round_robin``), medians of process CPU time with
wall time beside: ``forward``; ``trace`` the numerics eager run (the tracer, no side);
``trace+prints`` the same with each op's output fingerprinted; each ``numerics SIDE`` end to end.
The floor adds ``trace+prints`` (one more eager run) plus the fingerprints of the side's own run to
``dtype:*``/``compile:*``, and the fingerprints of its two runs to ``export`` (its alignment run is
the first): the table prints that estimate as a share of each side's time.

``x plain`` = numerics / (eager + the side's plain run) on the medians (target: at most 3);
``x memory`` = numerics' peak RSS / eager's peak RSS (target: at most 2); ``side peak`` is the
plain side run's; ``added e/n`` is what eager and numerics each add above the built model, and
``x added`` their ratio: the stricter reading (eager under no_grad frees each activation at once).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = {"gpt2": 12, "gpt2-48": 48}
HEADERS = ["model", "side", "eager", "side plain", "numerics", "x plain", "eager peak", "side peak",
           "numerics peak", "x memory", "added e/n", "x added"]


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def child(model_name: str, work: str, reps: int, seq: int) -> dict[str, Any]:
    sys.path.insert(0, HERE)
    from _common import gpt2, pin_threads, quiet_transformers

    pin_threads(1)
    quiet_transformers()
    import torch

    model, args = gpt2(MODELS[model_name], seq=seq)
    fn = _work(work, model, args)
    fn()  # warm-up: first-call costs, allocator pools
    import gc

    gc.collect()
    base = _rss_kb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    del torch
    return {"seconds": statistics.median(times), "times": times, "peak_kb": _rss_kb("VmHWM"), "base_kb": base}


def _work(work: str, model: Any, args: tuple[Any, ...]) -> Any:
    import copy

    import torch

    if work == "eager":
        def eager() -> None:
            with torch.no_grad():
                model(*args)
        return eager
    if work in ("dtype:bfloat16", "dtype:float16"):
        low = copy.deepcopy(model).to(getattr(torch, work.split(":")[1]))

        def cast() -> None:
            with torch.no_grad():
                low(*args)
        return cast
    if work == "autocast:bfloat16":
        def autocast() -> None:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                model(*args)
        return autocast
    if work == "export":
        def export() -> None:
            ep = torch.export.export(model, args, kwargs={"use_cache": False}, strict=False)
            with torch.no_grad():
                ep.module()(*args, use_cache=False)
        return export
    if work == "export run":
        ep = torch.export.export(model, args, kwargs={"use_cache": False}, strict=False)
        m = ep.module()

        def run() -> None:
            with torch.no_grad():
                m(*args, use_cache=False)
        return run
    if work.startswith("compile:"):
        import torch._dynamo as dynamo

        backend = work.split(":", 1)[1]

        def first_call() -> None:
            dynamo.reset()  # every call compiles, as the first one does (Inductor's disk caches stay warm)
            compiled = torch.compile(model, backend=backend)
            with torch.no_grad():
                compiled(*args)
            dynamo.reset()
        return first_call
    if work.startswith("numerics "):
        import fxviz

        side = work.split(" ", 1)[1]
        return lambda: fxviz.numerics(model, args, against=side)
    raise SystemExit(f"unknown work {work!r}")


def floor_child(model_name: str, sides: list[str], reps: int, seq: int) -> dict[str, Any]:
    """``--floor``: the works side by side in this process (see the module's docstring)."""
    sys.path.insert(0, HERE)
    from _common import gpt2, pin_threads, quiet_transformers, round_robin

    pin_threads(1)
    quiet_transformers()
    import torch

    import fxviz
    from fxviz.analyze.numerics.floor import Prints
    from fxviz.analyze.numerics.run import Watcher, run_eager

    model, args = gpt2(MODELS[model_name], seq=seq)

    def forward() -> None:
        with torch.no_grad():
            model(*args)

    def printed() -> None:  # the run and the one read of its fingerprints
        prints = Prints()
        run_eager(model, args, {}, prints, seed=0)
        prints.read()

    fns: dict[str, Any] = {
        "forward": forward,
        "trace": lambda: run_eager(model, args, {}, Watcher(), seed=0),
        "trace+prints": printed,
    }
    for side in sides:
        fns[f"numerics {side}"] = lambda side=side: fxviz.numerics(model, args, against=side)
    cpu: dict[str, list[float]] = {}
    wall = round_robin(fns, reps, warmup=1, cpu=cpu)
    return {"wall": wall, "cpu": cpu}


def floor_table(model: str, sides: list[str], reps: int, seq: int) -> list[list[str]]:
    cmd = [sys.executable, __file__, "--floor-child", model, "--sides", ",".join(sides), "--reps", str(reps),
           "--seq", str(seq)]
    env = {**os.environ, "PYTHONPATH": os.path.dirname(HERE) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{model} --floor failed:\n{out.stderr[-3000:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    cpu = {k: statistics.median(v) for k, v in got["cpu"].items()}
    wall = {k: statistics.median(v) for k, v in got["wall"].items()}
    rows = []
    for k in cpu:
        rows.append([model, k, f"{cpu[k]:.3f} s", f"{cpu[k] / cpu['forward']:.2f}", f"{wall[k]:.3f} s",
                     f"{wall[k] / wall['forward']:.2f}", ""])
    prints_c = max(cpu["trace+prints"] - cpu["trace"], 0.0)  # within the rounds' noise it can come out below 0
    prints_w = max(wall["trace+prints"] - wall["trace"], 0.0)
    for side in sides:
        k = f"numerics {side}"
        extra_c = 2 * prints_c if side == "export" else cpu["trace+prints"] + prints_c
        extra_w = 2 * prints_w if side == "export" else wall["trace+prints"] + prints_w
        rows.append([model, f"floor in {k}", f"{extra_c:.3f} s", f"{extra_c / cpu['forward']:.2f}", f"{extra_w:.3f} s",
                     f"{extra_w / wall['forward']:.2f}", f"{extra_c / cpu[k]:.0%} CPU / {extra_w / wall[k]:.0%} wall"])
    return rows


def measure(model: str, work: str, reps: int, seq: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", model, work, "--reps", str(reps), "--seq", str(seq)]
    env = {**os.environ, "PYTHONPATH": os.path.dirname(HERE) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{model} {work} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--child", nargs=2)
    p.add_argument("--models", default="gpt2,gpt2-48")
    p.add_argument("--sides", default="dtype:bfloat16,export")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--out", default=None)
    p.add_argument("--floor", action="store_true", help="what the eager noise floor costs (see the docstring)")
    p.add_argument("--floor-child", default=None)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.child[0], a.child[1], a.reps, a.seq)))
        return
    if a.floor_child:
        print(json.dumps(floor_child(a.floor_child, a.sides.split(","), a.reps, a.seq)))
        return
    sys.path.insert(0, HERE)
    from _common import fmt_s, table, write_json

    if a.floor:
        rows = [r for m in a.models.split(",") for r in floor_table(m, a.sides.split(","), a.reps, a.seq)]
        print(table(["model", "work", "CPU", "x forward", "wall", "x forward (wall)", "share of numerics"], rows))
        return

    rows, results = [], {}
    for model in a.models.split(","):
        reps = a.reps if model == "gpt2" else 1
        eager = measure(model, "eager", reps, a.seq)
        results[model] = {"eager": eager}
        for side in a.sides.split(","):
            plain = measure(model, side, reps, a.seq)
            num = measure(model, f"numerics {side}", reps, a.seq)
            results[model][side] = {"plain": plain, "numerics": num}
            two = eager["seconds"] + plain["seconds"]
            act_e = max(eager["peak_kb"] - eager["base_kb"], 1)
            act_n = num["peak_kb"] - num["base_kb"]
            rows.append([
                model, side, fmt_s(eager["seconds"]), fmt_s(plain["seconds"]), fmt_s(num["seconds"]),
                f"{num['seconds'] / two:.2f}", f"{eager['peak_kb'] / 1024:.0f} MB",
                f"{plain['peak_kb'] / 1024:.0f} MB", f"{num['peak_kb'] / 1024:.0f} MB",
                f"{num['peak_kb'] / eager['peak_kb']:.2f}", f"{act_e / 1024:.0f} / {act_n / 1024:.0f} MB",
                f"{act_n / act_e:.2f}",
            ])
            print(table(HEADERS, rows[-1:]), file=sys.stderr)
    print(table(HEADERS, rows))
    write_json(a.out, results)


if __name__ == "__main__":
    main()
