"""Eager tracer cost: fxviz's runtime tracer next to a plain forward and to torchlens, torchview and
torchvista, on the same models, in one run, torch pinned to one thread.

    bash bench/setup.sh                      # once: bench/.venv with the other tools
    bench/.venv/bin/python bench/tracer.py [--reps N] [--models gpt2,resnet,stack] [--out r.json]

Columns (medians of interleaved rounds after one warm-up; ``x`` = time / plain forward):

- ``forward``: ``model(*args)`` under ``torch.no_grad()`` (what the other tools run);
- ``mode+hooks floor``: the forward under an empty ``TorchFunctionMode`` and empty global module
  hooks, what fxviz's tracer pays before it records anything (no tool can record for less);
- ``fxviz eager``: ``fxviz.capture(model, args, method="eager")``, conversion and passes included;
  ``fxviz tracer``: the same with ``passes=()`` (the tracer and IR building alone);
- ``torchview``: ``draw_graph(model, input_data=[...], expand_nested=True)``; no image is rendered
  (``save_graph=False``), but its graphviz DOT source is built;
- ``torchvista``: its capture, ``torchvista.engine.process_graph`` (what ``trace_model`` runs before
  it writes HTML); ``torchvista+html`` is the whole ``trace_model`` writing its HTML file;
- ``torchlens``: ``torchlens.trace(model, args)`` with its defaults (saves every activation, as the
  old ``log_forward_pass`` did); ``torchlens meta``: ``save=None`` (metadata only). torchlens
  wraps torch's functions on its first call and keeps them wrapped, so its rounds run last, in a
  block, and ``unwrap_torch()`` follows; the forward is timed again after that.

Per-op overhead on the residual stack: (tool time - forward) / ops, with ops = 3 per layer
(linear, relu, add). The first table is process CPU time (``time.process_time``: blind to waiting
for a core on a shared machine), wall time in brackets. Targets (issue 18): fxviz eager <= 1.05x a
plain forward on GPT-2, <= 12 us per recorded op (passes included), faster than each other tool on
every model. Reference (issue 18, seq 128, one thread, CPU time): fxviz 1.33x before the writer
fix, torchview 1.24x, torchvista 1.26x.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import (  # noqa: E402
    environment,
    fmt_s,
    med,
    pin_threads,
    quiet_transformers,
    round_robin,
    table,
    timed,
    write_json,
)

STACK_OPS_PER_LAYER = 3  # linear, relu, add


# ---- models ----------------------------------------------------------------------------------------


def build_models(stack_layers: int) -> dict[str, Callable[[], tuple[Any, tuple[Any, ...], int | None]]]:
    import torch
    from torch import nn

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = (
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                if stride != 1 or cin != cout
                else None
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + identity)

    class ResNet18(nn.Module):
        """torchvision's resnet18 layout, written out (no CPU torchvision here)."""

        def __init__(self, num_classes: int = 1000) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            chans, layers, cin = [64, 128, 256, 512], [], 64
            for i, c in enumerate(chans):
                stride = 1 if i == 0 else 2
                layers.append(nn.Sequential(BasicBlock(cin, c, stride), BasicBlock(c, c)))
                cin = c
            self.layer1, self.layer2, self.layer3, self.layer4 = layers
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(512, num_classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    class Residual(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.fc = nn.Linear(dim, dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.relu(self.fc(x))

    class Stack(nn.Module):
        def __init__(self, layers: int, dim: int = 64) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Residual(dim) for _ in range(layers))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = b(x)
            return x

    def gpt2() -> tuple[Any, tuple[Any, ...], int | None]:
        from _common import gpt2 as build

        model, args = build(seq=128)
        return model, args, None

    def gpt2_narrow() -> tuple[Any, tuple[Any, ...], int | None]:
        # GPT-2 small's 12 blocks and ops at width 64: the capture's cost per op with little
        # arithmetic around it (for callgrind, where the full model's matmuls take minutes)
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=64, n_head=2, vocab_size=1000)).eval()
        return model, (torch.randint(0, 1000, (1, 128)),), None

    def gpt2_tiny() -> tuple[Any, tuple[Any, ...], int | None]:
        # two of GPT-2's blocks at width 64, seq 32: what Dynamo traces per block, for callgrind
        # on a shared machine (gpt2-narrow's compile takes most of an hour there)
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000)).eval()
        return model, (torch.randint(0, 1000, (1, 32)),), None

    def resnet() -> tuple[Any, tuple[Any, ...], int | None]:
        torch.manual_seed(0)
        return ResNet18().eval(), (torch.randn(1, 3, 224, 224),), None

    def stack() -> tuple[Any, tuple[Any, ...], int | None]:
        torch.manual_seed(0)
        return Stack(stack_layers).eval(), (torch.randn(8, 64),), stack_layers * STACK_OPS_PER_LAYER

    return {
        "gpt2": gpt2,
        "gpt2-narrow": gpt2_narrow,
        "gpt2-tiny": gpt2_tiny,
        "resnet": resnet,
        "stack": stack,
    }


MODEL_LABELS = {
    "gpt2": "GPT-2 small, seq 128",
    "gpt2-narrow": "GPT-2 small's ops at width 64, seq 128",
    "gpt2-tiny": "two GPT-2 blocks at width 64, seq 32",
    "resnet": "ResNet-18 (by hand), 1x3x224x224",
    "stack": "residual stack ({n} x Linear 64 + ReLU + add), 8x64",
}


# ---- tools -----------------------------------------------------------------------------------------


def eager_available() -> str | None:
    """None when ``fxviz.capture(..., method="eager")`` works, else why not."""
    import torch

    import fxviz
    from fxviz import api

    if "eager" not in getattr(api, "METHODS", ()):
        return "n/a (eager tracer not available: fxviz.capture has no method 'eager')"
    try:
        fxviz.capture(torch.nn.Linear(2, 2), (torch.randn(1, 2),), method="eager")
    except Exception as e:  # noqa: BLE001
        return f"n/a (eager tracer failed on nn.Linear: {type(e).__name__}: {e})"
    return None


def tool_fns(model: Any, args: tuple[Any, ...], tmpdir: str) -> dict[str, Callable[[], Any]]:
    """The round-robin tools (torchlens runs apart, see the module docstring)."""
    import torch

    import fxviz

    def forward() -> Any:
        with torch.no_grad():
            return model(*args)

    fns: dict[str, Callable[[], Any]] = {"forward": forward}
    fns["mode+hooks floor"] = floor_fn(model, args)
    fns["fxviz eager"] = lambda: fxviz.capture(model, args, method="eager")
    fns["fxviz tracer"] = lambda: fxviz.capture(model, args, method="eager", passes=())

    try:
        from torchview import draw_graph

        fns["torchview"] = lambda: draw_graph(model, input_data=list(args), expand_nested=True)
        if getattr(getattr(model, "config", None), "use_cache", False):
            # torchview 0.2.7 fails on transformers' DynamicCache output (KeyError on a tensor id);
            # measure() retries with the cache off and notes it
            fns["torchview (use_cache=False)"] = lambda: draw_graph(
                model, input_data=list(args), expand_nested=True, use_cache=False
            )
    except ImportError:
        pass

    try:
        import torchvista  # noqa: F401
        from torchvista.engine import process_graph

        def vista_capture() -> Any:
            containers: dict[str, Any] = {
                "adj_list": {}, "module_info": {}, "func_info": {}, "node_to_module_path": {},
                "parent_module_to_nodes": defaultdict(list), "parent_module_to_depth": {},
                "graph_node_name_to_without_suffix": {}, "graph_node_display_names": {},
                "node_to_ancestors": defaultdict(list), "repeat_containers": set(), "node_to_attr_name": {},
            }
            process_graph(model, args, *containers.values(), show_non_gradient_nodes=True,
                          forced_module_tracing_depth=None)
            return containers

        def vista_html() -> Any:
            from torchvista import trace_model

            with contextlib.redirect_stdout(io.StringIO()):  # it "displays" an HTML object
                trace_model(model, args, export_path=os.path.join(tmpdir, "torchvista.html"))

        fns["torchvista"] = vista_capture
        fns["torchvista+html"] = vista_html
    except ImportError:
        pass
    return fns


def floor_fn(model: Any, args: tuple[Any, ...]) -> Callable[[], Any]:
    """The forward under what any tracer of this kind pays before it records anything: an empty
    ``TorchFunctionMode`` (sees every torch call) and empty global module pre/forward hooks (see
    every module call), as fxviz's eager tracer installs them."""
    import torch
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
    from torch.overrides import TorchFunctionMode

    class Empty(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            return func(*args, **(kwargs or {}))

    def floor() -> Any:
        handles = [register_module_forward_pre_hook(lambda m, a: None),
                   register_module_forward_hook(lambda m, a, o: None)]
        try:
            with torch.no_grad(), Empty():
                return model(*args)
        finally:
            for h in handles:
                h.remove()

    return floor


def torchlens_fns(model: Any, args: tuple[Any, ...]) -> dict[str, Callable[[], Any]]:
    try:
        import torchlens as tl
    except ImportError:
        return {}
    inputs = list(args)
    return {
        "torchlens": lambda: tl.trace(model, inputs),
        "torchlens meta": lambda: tl.trace(model, inputs, save=None),
    }


def measure(
    key: str, build: Callable[[], Any], reps: int, eager_missing: str | None, tmpdir: str
) -> dict[str, Any]:
    t_build, (model, args, n_ops) = timed(build)
    res: dict[str, Any] = {"model": key, "build_s": t_build, "reps": reps, "errors": {}, "times_s": {}}

    fns = tool_fns(model, args, tmpdir)
    if eager_missing:
        fns.pop("fxviz eager")
        fns.pop("fxviz tracer")
        res["errors"]["fxviz eager"] = res["errors"]["fxviz tracer"] = eager_missing
    # a tool that fails on this model is reported, not timed; a retry variant ("tool (...)") is
    # kept only when the tool itself failed, and then stands in its column
    for name in list(fns):
        base = name.split(" (", 1)[0]
        if base != name and base in fns:
            del fns[name]
            continue
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                out = fns[name]()
            if name == "fxviz eager":
                res["fxviz_method"] = out.method
                res["fxviz_ops"] = len(out.ops)
        except Exception as e:  # noqa: BLE001
            res["errors"][name] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
            del fns[name]
    for name in [n for n in fns if " (" in n]:  # a retry that worked reports in the tool's column
        base = name.split(" (", 1)[0]
        res.setdefault("variants", {})[base] = name
        fns[base] = fns.pop(name)
    cpu: dict[str, list[float]] = {}
    with contextlib.redirect_stdout(io.StringIO()):
        res["times_s"].update(round_robin(fns, reps=reps, warmup=1, cpu=cpu))

    # torchlens last: it leaves torch wrapped until unwrap_torch()
    tl_fns = torchlens_fns(model, args)
    if tl_fns:
        from torchlens.backends.torch.wrappers import unwrap_torch

        try:
            for name in list(tl_fns):
                try:
                    tl_fns[name]()
                except Exception as e:  # noqa: BLE001
                    res["errors"][name] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
                    del tl_fns[name]
            with contextlib.redirect_stdout(io.StringIO()):
                res["times_s"].update(round_robin(tl_fns, reps=min(reps, 5), warmup=0, cpu=cpu))
        finally:
            unwrap_torch()
        res["times_s"]["forward (after torchlens)"] = round_robin({"f": fns["forward"]}, reps=reps)["f"]

    res["median_s"] = {k: med(v) for k, v in res["times_s"].items()}
    fwd = res["median_s"]["forward"]
    res["ratio"] = {k: v / fwd for k, v in res["median_s"].items()}
    # Robust to a shared machine: the median of per-round ratios (tools timed in the same rounds as
    # the forward; torchlens against the forward timed after it) and the ratio of the fastest rounds.
    t = res["times_s"]
    after = t.get("forward (after torchlens)", t["forward"])
    res["ratio_paired"] = {
        k: med([a / b for a, b in zip(v, after if k.startswith("torchlens") else t["forward"], strict=False)])
        for k, v in t.items() if not k.startswith("forward")
    }
    res["ratio_min"] = {k: min(v) / min(t["forward"]) for k, v in t.items() if not k.startswith("forward")}
    res["cpu_s"] = cpu
    res["ratio_cpu"] = {k: med(v) / med(cpu["forward"]) for k, v in cpu.items() if k != "forward"}
    if n_ops:
        res["ops"] = n_ops
        res["us_per_op"] = {k: (v - fwd) / n_ops * 1e6 for k, v in res["median_s"].items()
                            if not k.startswith("forward")}
        fmin, fcpu = min(t["forward"]), med(cpu["forward"])
        res["us_per_op_min"] = {k: (min(v) - fmin) / n_ops * 1e6 for k, v in t.items() if not k.startswith("forward")}
        res["us_per_op_cpu"] = {k: (med(v) - fcpu) / n_ops * 1e6 for k, v in cpu.items() if k != "forward"}
    return res


COLUMNS = ["mode+hooks floor", "fxviz eager", "fxviz tracer", "torchview", "torchvista", "torchvista+html", "torchlens",
           "torchlens meta"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt2,resnet,stack", help="comma-separated subset of gpt2,gpt2-narrow,gpt2-tiny,resnet,stack")
    ap.add_argument("--reps", type=int, default=None, help="measured rounds (default: 7 GPT-2, 15 others; torchlens at most 5)")
    ap.add_argument("--stack-layers", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="also write the results as JSON to this path")
    ap.add_argument("--one-model-to", default=None, help=argparse.SUPPRESS)  # child process: one model
    ns = ap.parse_args(argv)

    pin_threads(ns.threads)
    quiet_transformers()
    t0 = time.perf_counter()
    eager_missing = eager_available()
    if eager_missing:
        print(eager_missing, file=sys.stderr)
    builders = build_models(ns.stack_layers)
    results = []
    keys = [k.strip() for k in ns.models.split(",") if k.strip()]
    with tempfile.TemporaryDirectory() as tmpdir:
        for key in keys:
            label = MODEL_LABELS[key].format(n=ns.stack_layers)
            if not ns.one_model_to:
                print(f"... {label}", file=sys.stderr, flush=True)
            if len(keys) == 1:
                r = measure(key, builders[key], ns.reps or (7 if key == "gpt2" else 15), eager_missing, tmpdir)
            else:
                # one process per model: torchlens wraps torch's functions and unwrap_torch() does
                # not restore their speed, which made every tool timed after it slower (fxviz's
                # tracer 29 instead of 17 us per op on the stack when the stack came last)
                out = os.path.join(tmpdir, f"{key}.json")
                child = [sys.executable, str(Path(__file__).resolve()), "--models", key, "--one-model-to", out,
                         "--threads", str(ns.threads), "--stack-layers", str(ns.stack_layers)]
                if ns.reps:
                    child += ["--reps", str(ns.reps)]
                subprocess.run(child, check=True, stdout=subprocess.DEVNULL)
                with open(out) as f:
                    r = json.load(f)
            r["label"] = label
            results.append(r)
            if ns.one_model_to:
                with open(ns.one_model_to, "w") as f:
                    json.dump(r, f)
                return 0

    present = [c for c in COLUMNS if any(c in r["median_s"] or c in r["errors"] for r in results)]

    def cell(r: dict[str, Any], c: str, fmt: Callable[[dict[str, Any], str], str]) -> str:
        if c in r["median_s"]:
            return fmt(r, c)
        if c in r["errors"]:
            return "n/a" if c.startswith("fxviz") and eager_missing else "fails"
        return "-"

    print(f"\n## Tracer: time / plain forward ({ns.threads} thread, medians of process CPU time; wall)\n")
    rows = [
        [r["label"], f"{fmt_s(med(r['cpu_s']['forward']))} ({fmt_s(r['median_s']['forward'])})"]
        + [cell(r, c, lambda r, c: f"{r['ratio_cpu'][c]:.2f}x ({r['ratio'][c]:.2f}x)"
                + ("*" if c in r.get("variants", {}) else "")) for c in present]
        for r in results
    ]
    print(table(["model", "forward CPU (wall)", *present], rows))

    print("\nLess sensitive to other load on the machine: median of per-round wall ratios / ratio of the "
          "fastest rounds / ratio of median process CPU times:\n")
    print(table(
        ["model", *present],
        [[r["label"]] + [cell(r, c, lambda r, c: f"{r['ratio_paired'][c]:.2f} / {r['ratio_min'][c]:.2f} / "
                                                 f"{r['ratio_cpu'][c]:.2f}")
                         for c in present] for r in results],
    ))

    stack = next((r for r in results if "us_per_op" in r), None)
    if stack:
        print(f"\n## Overhead per recorded op, {stack['label']} ({stack['ops']} ops)\n")
        print(table(
            ["tool", "µs / op (CPU time medians)", "(wall medians)", "(fastest rounds)"],
            [[c, f"{stack['us_per_op_cpu'][c]:.1f}", f"{stack['us_per_op'][c]:.1f}", f"{stack['us_per_op_min'][c]:.1f}"]
             if c in stack["us_per_op"] else [c, cell(stack, c, lambda r, c: ""), "", ""] for c in present],
        ))

    notes = []
    for r in results:
        for tool, err in r["errors"].items():
            if not (tool.startswith("fxviz") and eager_missing):
                notes.append(f"- {tool} on {r['label']}: {err}")
        after = r["median_s"].get("forward (after torchlens)")
        if after:
            notes.append(f"- {r['label']}: forward {fmt_s(r['median_s']['forward'])} before torchlens, "
                         f"{fmt_s(after)} after unwrap_torch()")
        for tool, variant in r.get("variants", {}).items():
            notes.append(f"- * {tool} on {r['label']}: timed as {variant}")
        if "fxviz_ops" in r:
            notes.append(f"- {r['label']}: fxviz eager recorded {r['fxviz_ops']} ops ({r['fxviz_method']})")
    if eager_missing:
        notes.insert(0, f"- fxviz eager: {eager_missing}")
    if notes:
        print("\n" + "\n".join(notes))
    env = environment()
    for mod in ("torchlens", "torchview", "torchvista"):
        try:
            import importlib.metadata as md

            env[mod] = md.version(mod)
        except Exception:  # noqa: BLE001
            env[mod] = "not installed"
    print(f"\n{env} — total {time.perf_counter() - t0:.0f} s")
    write_json(ns.out, {"environment": env, "eager_missing": eager_missing, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
