"""Compare cost: what fxviz.compare adds on top of the two captures it needs.

    .venv/bin/python bench/compare.py [--reps N] [--models gpt2,gpt2-48] [--out results.json]

For each model (GPT-2 small from its default config, ``input_ids`` of length 128; the same with 48
layers), in interleaved rounds after one warm-up round, torch pinned to one thread:

- ``export``: ``fxviz.capture(model, args, method="export")`` with every input size symbolic
  (``Dim.AUTO``), the symbolic side ``compare`` captures (conversion and passes included);
- ``static``: the same export with static sizes, for reference: what symbolic sizes cost;
- ``eager``: ``fxviz.capture(model, args, method="eager")``, the eager side ``compare`` uses;
- ``align``: ``fxviz.diff`` of those two graphs (captured once, outside the timing);
- ``compare``: ``fxviz.compare(model, args)`` end to end.

``align %`` = align / (export + eager) on the medians. Target (issue 5): at most 25%.
"""

from __future__ import annotations

import argparse
from typing import Any

from _common import (  # noqa: E402
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

MODELS = {"gpt2": 12, "gpt2-48": 48}


def bench(name: str, reps: int) -> dict[str, Any]:
    from torch.export import Dim

    import fxviz

    model, args = gpt2(n_layer=MODELS[name], seq=128)
    auto = [{i: Dim.AUTO for i in range(t.dim())} for t in args]
    a = fxviz.capture(model, args, method="export", dynamic_shapes=auto)
    b = fxviz.capture(model, args, method="eager")
    fns = {
        "export": lambda: fxviz.capture(model, args, method="export", dynamic_shapes=auto),
        "static": lambda: fxviz.capture(model, args, method="export"),
        "eager": lambda: fxviz.capture(model, args, method="eager"),
        "align": lambda: fxviz.diff(a, b),
        "compare": lambda: fxviz.compare(model, args),
    }
    times = round_robin(fns, reps=reps, warmup=1)
    d = fxviz.diff(a, b)
    return {
        "model": name, "ops": [len(a.ops), len(b.ops)], "times": times,
        "summary": d.summary(), "significant": len(d.significant), "modules": d.status_counts(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None)
    opts = p.parse_args()
    pin_threads(opts.threads)
    quiet_transformers()
    results = [bench(m, opts.reps) for m in opts.models.split(",")]
    rows = []
    for r in results:
        t = {k: med(v) for k, v in r["times"].items()}
        both = t["export"] + t["eager"]
        rows.append([
            r["model"], f"{r['ops'][0]} / {r['ops'][1]}", fmt_s(t["export"]), fmt_s(t["static"]), fmt_s(t["eager"]),
            fmt_s(t["align"]), f"{100 * t['align'] / both:.1f}%", fmt_s(t["compare"]),
            f"{100 * (t['compare'] / both - 1):+.1f}%", str(r["significant"]),
        ])
    print(table(["model", "ops (export / eager)", "export", "export (static sizes)", "eager", "align", "align %", "compare",
                 "compare vs both", "significant"], rows))
    print(f"\nmedians of {opts.reps} interleaved rounds; {environment()}")
    write_json(opts.out, {"environment": environment(), "results": results})


if __name__ == "__main__":
    main()
