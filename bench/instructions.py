"""Eager capture cost in instructions (valgrind's callgrind): a figure a loaded machine does not move,
for the before/after of a change to the tracer, its passes or the snapshot, where process CPU time on
a shared machine swings by more than the change.

    python bench/instructions.py [--models stack,gpt2-narrow,gpt2-tiny,resnet,gpt2] [--parts capture,tracer,forward,snapshot,passes,
                                 export,capture-export,capture-export-novalidate,compile,compile-map,
                                 eager-trace,eager-trace-skim]
                                 [--reps 2] [--stack-layers 300]

Each part runs twice untimed (imports, first-call caches), then ``--reps`` times inside
``functools.reduce``, the only code callgrind collects (``--toggle-collect=functools_reduce``): the
count excludes starting Python and importing torch. Parts: ``capture`` is
``fxviz.capture(model, args, method="eager")``, ``tracer`` the same with ``passes=()``, ``forward``
the plain forward under ``torch.no_grad()``, ``floor`` the forward under an empty
``TorchFunctionMode`` and empty global module hooks (what any tracer of this kind pays), ``snapshot`` taking and restoring the model's snapshot
(:class:`fxviz.torchbridge.guard.Snapshot`), ``passes`` the capture's passes alone, rerun on one
graph captured with ``passes=()``. The export path (issue 18 point 10): ``export`` is bare
``torch.export.export`` as fxviz's export method calls it (bench/capture.py's ``export``), ``capture-export`` ``fxviz.capture(model, args,
method="export")`` and ``capture-export-novalidate`` the same with ``validate=False``; their ratios
to ``export`` are printed. The compile map (point 11): ``compile`` is a bare first call of
``torch.compile(model, backend="aot_eager")`` under ``torch.no_grad()`` between two
``torch._dynamo.reset()`` (bench/compile.py's ``bare``), ``compile-map``
``fxviz.compile_map(model, args, backend="aot_eager")``, ``eager-trace`` the eager trace it adds
(``trace_eager``) and ``eager-trace-skim`` the same with the kernels skipped as the map skips them
where Dynamo broke no graph (:class:`fxviz.fallback.shapes_only.ShapesOnly`); the ratio is printed (Dynamo's own work
moves by 10-20% between runs in CPU time, instructions do not). Printed: instructions per call, and per recorded op
beyond the forward for the stack. Slow: about 50x a plain run per part (minutes each on GPT-2).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

STACK_OPS_PER_LAYER = 3


def child(model_name: str, part: str, reps: int, layers: int) -> None:
    """Run ``part`` under callgrind's collection (this process is the one valgrind runs)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from _common import pin_threads

    pin_threads(1)
    import torch
    from tracer import build_models, floor_fn

    import fxviz
    from fxviz.fallback.shapes_only import ShapesOnly
    from fxviz.fallback.trace import trace_eager
    from fxviz.torchbridge.guard import Snapshot, walks_shared

    model, args, _ = build_models(layers)[model_name]()

    def forward() -> None:
        with torch.no_grad():
            model(*args)

    def snapshot() -> None:
        with walks_shared():
            Snapshot(model, [args, {}]).restore()

    fn = {
        "capture": lambda: fxviz.capture(model, args, method="eager"),
        "tracer": lambda: fxviz.capture(model, args, method="eager", passes=()),
        "forward": forward,
        "snapshot": snapshot,
        "floor": floor_fn(model, args),
        "passes": passes_fn(model, args),
        "export": bare_export(model, args),
        "capture-export": lambda: fxviz.capture(model, args, method="export"),
        "capture-export-novalidate": lambda: fxviz.capture(model, args, method="export", validate=False),
        "compile": bare_compile(model, args),
        "compile-map": lambda: fxviz.compile_map(model, args, backend="aot_eager"),
        "eager-trace": lambda: trace_eager(model, args),
        "eager-trace-skim": lambda: trace_eager(model, args, watch=lambda _: ShapesOnly()),
    }[part]
    for _ in range(2):
        fn()
    functools.reduce(lambda acc, _: fn(), range(reps), None)


def bare_export(model: Any, args: tuple[Any, ...]) -> Callable[[], Any]:
    """``torch.export.export`` as fxviz's export method calls it (on the model with its inputs and
    outputs flattened: a GPT-2 returns a ``DynamicCache`` export cannot), as bench/capture.py does."""
    import torch

    from fxviz.torchbridge.normalize import NormalizedModel, flatten_inputs

    flat = flatten_inputs(model, args, {})
    return lambda: torch.export.export(NormalizedModel(model, flat, {}), flat.tensors)


def bare_compile(model: Any, args: tuple[Any, ...]) -> Callable[[], Any]:
    """A first call of ``torch.compile`` with Dynamo's caches cold, as bench/compile.py's ``bare``."""
    import torch
    import torch._dynamo as dynamo

    def run() -> Any:
        dynamo.reset()
        with torch.no_grad():
            out = torch.compile(model, backend="aot_eager")(*args)
        dynamo.reset()
        return out

    return run


def passes_fn(model: Any, args: tuple[Any, ...]) -> Callable[[], Any]:
    """The passes a capture runs (``CAPTURE_PASSES``), again and again on one graph captured with
    ``passes=()`` (each pass is idempotent): their share of ``capture`` without the tracer's."""
    import fxviz
    from fxviz.analyze.flops import CAPTURE_PASSES
    from fxviz.passes import run_passes

    graph = fxviz.capture(model, args, method="eager", passes=())
    return lambda: run_passes(graph, CAPTURE_PASSES)


def count(model_name: str, part: str, reps: int, layers: int) -> int:
    sys.path.insert(0, str(Path(__file__).parent))
    from _common import callgrind_count

    return callgrind_count(__file__, model_name, part, reps, layers)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="stack")
    ap.add_argument("--parts", default="capture,tracer,forward,snapshot")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--stack-layers", type=int, default=300)
    a = ap.parse_args()
    for model_name in a.models.split(","):
        got = {part: count(model_name, part, a.reps, a.stack_layers) for part in a.parts.split(",")}
        line = ", ".join(f"{part} {n / 1e6:.1f} M" for part, n in got.items())
        if model_name == "stack" and "forward" in got:
            ops = a.stack_layers * STACK_OPS_PER_LAYER
            line += "; per op beyond the forward: " + ", ".join(
                f"{part} {(n - got['forward']) / ops / 1e3:.0f} k" for part, n in got.items()
                if part in ("capture", "tracer", "floor"))
        if "export" in got:  # issue 18 point 10: the export path against bare torch.export
            line += "; x bare export: " + ", ".join(
                f"{part} {n / got['export']:.3f}x" for part, n in got.items() if part.startswith("capture-export"))
        if "compile" in got and "compile-map" in got:  # issue 18 point 11
            line += f"; compile-map x bare compile: {got['compile-map'] / got['compile']:.3f}x"
        print(f"{model_name}: instructions per call: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
