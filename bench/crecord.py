"""Can torch's own C++ per-op recording carry fxviz's eager capture, and at what cost per op?
(issue 18 point 9: <= 12 us per recorded op with the passes; an empty ``TorchFunctionMode`` plus
empty global module hooks already cost ~19 k instructions per op, so the recording has to move to C.)

    PYTHONPATH=$PWD python bench/crecord.py [--models stack,gpt2-narrow] [--reps 7] [--stack-layers 300]
                                           [--instructions PARTS] [--fidelity]

Parts (each one forward of the model under ``torch.no_grad()``, torch on one thread):

- ``forward``: the plain forward;
- ``floor``: the forward under an empty ``TorchFunctionMode`` and empty global module hooks (what
  fxviz's tracer pays before it records anything, bench/tracer.py's floor);
- ``hooks``: empty global module pre/post hooks alone (no mode);
- ``scopes``: global module hooks that open and close a ``_RecordFunctionFast`` scope named after the
  module (no recorder on: what the marker costs when nothing listens);
- ``prof``: torch's profiler (``_enable_profiler``, KINETO state, CPU activity, ``record_shapes``,
  nothing else) around the forward, with those scopes, then its event tree walked in Python into one
  tuple per op (name, input ``impl_ptr``s, module path) at the level fxviz's eager-aten records;
  ``prof-raw``: the same without the walk (profiler cost alone, event tree built);
  ``prof-noscope``: without the scopes and the walk;
- ``et``: the execution trace observer (``_add_execution_trace_observer``: inputs AND outputs with
  tensor ids per op, written as JSON by C++), with ``record_function`` scopes (the observer does not
  see ``_RecordFunctionFast``), then the JSON read back and walked into one tuple per op with its
  producers; ``et-raw``: observer and scopes, no read-back; ``et-noscope``: the observer alone;
- ``cext``: a minimal recorder in C++ (bench/_crecord.cpp, built with ``torch.utils.cpp_extension``): one
  thread-local RecordFunction callback recording each op at the level a dispatch mode sees it (inputs:
  TensorImpl address, dtype, sizes or the scalar; outputs) into C vectors; module hooks push and pop
  the module's index (one pybind call each); after the forward the records become Python tuples and
  one Python pass gives each op its producers and module path. ``cext-raw``: without that pass;
  ``cext-noscope``: the callback alone, records kept in C; ``cext-noinputs``: the callback without
  inputs and outputs (RecordFunction's own cost);
- ``jit``: ``torch.jit._get_trace_graph`` (TorchScript's C++ tracer, ops at the level of ``aten::linear``);
- ``aten``: ``fxviz.capture(model, args, method="eager-aten", passes=())`` (today's ATen tracer).

Printed: a markdown table, per part the medians of interleaved rounds of process CPU time (ms per
forward) and, on the stack, us per op beyond the forward (ops = 3 per layer: linear, relu, add, as
bench/tracer.py counts them). ``--instructions`` counts the parts in instructions with callgrind (as
bench/instructions.py, loads do not move it). ``--fidelity`` rebuilds the graph from the profiler's and
the observer's records and compares op list, data-flow edges and module of each op with fxviz's
eager-aten capture of the same model.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _common import callgrind_count, med, pin_threads, table  # noqa: E402

STACK_OPS_PER_LAYER = 3
PARTS = ("forward", "floor", "hooks", "scopes", "prof-noscope", "prof-raw", "prof", "et-noscope", "et-raw", "et",
         "cext-noinputs", "cext-noscope", "cext-raw", "cext", "jit", "aten")
BUILD_DIR = os.path.join(tempfile.gettempdir(), "fxviz_crecord_build")
ET_PATH = os.path.join("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir(), f"crecord-{os.getpid()}.json")


# ---- module scopes ------------------------------------------------------------------------------------


def module_names(model: Any) -> dict[int, str]:
    return {id(m): name for name, m in model.named_modules()}


@functools.cache
def _hooks() -> Any:
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    return register_module_forward_pre_hook, register_module_forward_hook


def with_hooks(pre: Callable[..., Any], post: Callable[..., Any], run: Callable[[], Any]) -> Any:
    reg_pre, reg_post = _hooks()
    handles = [reg_pre(pre), reg_post(post)]
    try:
        return run()
    finally:
        for h in handles:
            h.remove()


def fast_scopes(names: dict[int, str]) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """Hooks opening and closing a C-level ``RecordFunction`` (USER_SCOPE) named ``## path`` per module
    call: a marker the profiler records in its event tree (and costs next to nothing without it)."""
    from torch._C._profiler import _RecordFunctionFast

    stack: list[Any] = []

    def pre(mod: Any, args: Any) -> None:
        r = _RecordFunctionFast("## " + names.get(id(mod), "?"))
        r.__enter__()
        stack.append(r)

    def post(mod: Any, args: Any, out: Any) -> None:
        stack.pop().__exit__(None, None, None)

    return pre, post


def op_scopes(names: dict[int, str]) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The same marker as ``torch.autograd.profiler.record_function`` opens it (an op through the
    dispatcher: the execution trace observer records it, it does not see ``_RecordFunctionFast``)."""
    import torch

    enter = torch.ops.profiler._record_function_enter_new
    leave = torch.ops.profiler._record_function_exit._RecordFunction
    stack: list[Any] = []

    def pre(mod: Any, args: Any) -> None:
        stack.append(enter("## " + names.get(id(mod), "?"), None))

    def post(mod: Any, args: Any, out: Any) -> None:
        leave(stack.pop())

    return pre, post


# ---- which recorded ops fxviz's eager-aten would see ----------------------------------------------------


@functools.cache
def decomposes(name: str) -> bool:
    """True for an ATen op that a ``TorchDispatchMode`` never sees itself under ``no_grad``: its
    CompositeImplicitAutograd kernel runs first and the mode sees the ops it calls (``aten::linear``
    -> ``t``, ``addmm``)."""
    import torch

    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd"))
    except RuntimeError:
        return False


def is_scope(name: str) -> bool:
    return name.startswith("## ")


# ---- the profiler ---------------------------------------------------------------------------------------


def prof_run(model: Any, args: tuple[Any, ...], scopes: bool, walk: bool) -> Any:
    import torch
    import torch._C._profiler as p
    from torch._C._autograd import _disable_profiler, _enable_profiler, _prepare_profiler

    cfg = p.ProfilerConfig(p.ProfilerState.KINETO, True, False, False, False, False, p._ExperimentalConfig(), "")
    acts = {p.ProfilerActivity.CPU}

    def run() -> Any:
        _prepare_profiler(cfg, acts)
        _enable_profiler(cfg, acts)
        try:
            with torch.no_grad():
                model(*args)
        finally:
            result = _disable_profiler()
        return result

    result = with_hooks(*fast_scopes(module_names(model)), run) if scopes else run()
    tree = result.experimental_event_tree()
    return prof_ops(tree) if walk else tree


def prof_ops(tree: Any) -> list[tuple[str, tuple[Any, ...], str]]:
    """One tuple per op at the level a dispatch mode records: (name, inputs, module path), an input
    being a tensor's ``impl_ptr`` or the scalar as recorded. The profiler records no outputs."""
    from torch._C._profiler import _TensorMetadata

    ops: list[tuple[str, tuple[Any, ...], str]] = []

    def visit(events: Any, path: str) -> None:
        for e in events:
            name = e.name
            if is_scope(name):
                visit(e.children, name[3:])
            elif decomposes(f"{name}.{e.overload_name}" if e.overload_name else name):
                visit(e.children, path)
            else:
                ins = tuple(i.impl_ptr if isinstance(i, _TensorMetadata) else
                            [t.impl_ptr for t in i] if isinstance(i, list) else i
                            for i in e.extra_fields.inputs)
                ops.append((name, ins, path))

    visit(tree, "")
    return ops


# ---- the execution trace observer ---------------------------------------------------------------------------


def et_run(model: Any, args: tuple[Any, ...], scopes: bool, read: bool) -> Any:
    import torch
    import torch._C._profiler as p

    def run() -> None:
        p._add_execution_trace_observer(ET_PATH)
        p._enable_execution_trace_observer()
        try:
            with torch.no_grad():
                model(*args)
        finally:
            p._disable_execution_trace_observer()
            p._remove_execution_trace_observer()

    if scopes:
        with_hooks(*op_scopes(module_names(model)), run)
    else:
        run()
    if not read:
        return None
    with open(ET_PATH, "rb") as f:
        return et_ops(json.load(f)["nodes"])


def et_ops(nodes: list[dict[str, Any]]) -> list[tuple[str, tuple[Any, ...], tuple[int, ...], str]]:
    """One tuple per op at a dispatch mode's level: (name, inputs, output tensor ids, module path), an
    input being ``("t", tensor id)`` or the scalar as recorded. Nodes are written as ops end; their ids
    are taken as they begin, so sorting by id gives call order, ``ctrl_deps`` the parent."""
    by_id = {n["id"]: n for n in nodes}
    kept: list[tuple[str, tuple[Any, ...], tuple[int, ...], str]] = []
    path_of: dict[int, str] = {}
    hidden: dict[int, bool] = {}  # inside an op a dispatch mode sees (its callees are not seen)
    for i in sorted(by_id):
        n = by_id[i]
        name = n["name"]
        parent = n["ctrl_deps"]
        path = path_of.get(parent, "")
        under = hidden.get(parent, False)
        if name.startswith("## "):
            path_of[i], hidden[i] = name[3:], False
            continue
        if name.startswith("[pytorch|") or name.startswith("profiler::"):
            path_of[i], hidden[i] = path, under
            continue
        path_of[i] = path
        schema = next(a["value"] for a in n["attrs"] if a["name"] == "op_schema")  # "aten::add.Tensor(Tensor self, ...)"
        if under or decomposes(schema[:schema.index("(")] if schema else name):
            hidden[i] = under
            continue
        hidden[i] = True
        ins = n["inputs"]
        args = tuple(("t", v[0]) if t.startswith("Tensor(") else v
                     for v, t in zip(ins["values"], ins["types"], strict=True))
        outs = tuple(v[0] for v, t in zip(n["outputs"]["values"], n["outputs"]["types"], strict=True)
                     if t.startswith("Tensor("))
        kept.append((name, args, outs, path))
    return kept


# ---- a minimal C++ RecordFunction recorder (bench/_crecord.cpp) ---------------------------------------------


@functools.cache
def cext() -> Any:
    """bench/_crecord.cpp built with torch's ``cpp_extension`` (about 2 minutes the first time)."""
    from torch.utils.cpp_extension import load

    os.makedirs(BUILD_DIR, exist_ok=True)
    return load("fxviz_crecord", [str(Path(__file__).with_name("_crecord.cpp"))], build_directory=BUILD_DIR,
                extra_cflags=["-O2", "-DNDEBUG"], verbose=False)


def cext_run(model: Any, args: tuple[Any, ...], scopes: bool, inputs: bool = True, build: bool = True) -> Any:
    """The C recorder around one forward; module hooks push and pop the module's index (a pybind call
    each); then, with ``build``, one Python pass gives each op its producers and module path."""
    import torch

    ext = cext()
    mods = list(model.named_modules())
    index = {id(m): i for i, (_, m) in enumerate(mods)}
    push, pop = ext.push, ext.pop

    def run() -> None:
        ext.start(inputs)
        try:
            with torch.no_grad():
                model(*args)
        finally:
            rec = ext.stop()
        return rec

    rec = with_hooks(lambda m, a: push(index.get(id(m), -1)), lambda m, a, o: pop(), run) if scopes else run()
    return cext_graph(rec, [n for n, _ in mods]) if build else rec


def cext_graph(rec: Any, names: list[str]) -> list[tuple[str, tuple[int | str, ...], str]]:
    ops, parent, module = rec
    producer: dict[int, int] = {}
    out: list[tuple[str, tuple[int | str, ...], str]] = []
    for k, (name, scope, ins, outs) in enumerate(ops):
        srcs = tuple(producer.get(t[0], "ext") for v in ins for t in (v if type(v) is list else (v,))
                     if type(t) is tuple)
        out.append((name, srcs, names[module[scope]] if scope >= 0 else ""))
        for v in outs:
            for t in v if type(v) is list else (v,):
                if type(t) is tuple:
                    producer[t[0]] = k
    return out


def mode_like(rec: Any, names: list[str]) -> list[tuple[str, tuple[int | str, ...], str]]:
    ops, parent, module = rec
    ops = [("aten::view" if o[0] == "aten::_reshape_alias" else o[0], *o[1:]) for o in ops if o[0] != "aten::detach_"]
    return cext_graph((ops, parent, module), names)


# ---- TorchScript's tracer -------------------------------------------------------------------------------------


def jit_trace(model: Any, args: tuple[Any, ...]) -> Any:
    """TorchScript's C++ tracer (what ONNX export ran on): every op at the tracer's dispatch key, so
    ``aten::linear`` rather than ``t`` and ``addmm``, with data-flow edges and module scopes
    (``Module._slow_forward`` pushes one per call). ``None`` where it cannot trace the model."""
    import torch

    try:
        with torch.no_grad():
            return torch.jit._get_trace_graph(model, args)[0]
    except Exception:  # noqa: BLE001 - a spike: report that it fails, not why
        return None


# ---- fidelity against fxviz's eager-aten capture ------------------------------------------------------------


def aten_reference(model: Any, args: tuple[Any, ...]) -> list[tuple[str, tuple[int | str, ...], str]]:
    """fxviz's eager-aten graph as (op name, producers, module path) per op node; a producer is the
    index of the op node that made the input or ``"ext"`` (input, parameter, constant)."""
    import fxviz

    g = fxviz.capture(model, args, method="eager-aten", passes=())
    index: dict[str, int] = {}
    out: list[tuple[str, tuple[int | str, ...], str]] = []
    for n in g.nodes:
        if n.kind != "op":
            continue
        index[n.name] = len(out)
        target = n.target.removeprefix("aten.").rsplit(".", 1)[0]
        out.append(("aten::" + target, tuple(index.get(r.node, "ext") for r in n.inputs),
                    n.stack[-1][0] if n.stack else ""))
    return out


def et_graph(ops: list[tuple[str, tuple[Any, ...], tuple[int, ...], str]]) -> list[tuple[str, tuple[int | str, ...], str]]:
    producer: dict[int, int] = {}
    out: list[tuple[str, tuple[int | str, ...], str]] = []
    for k, (name, ins, outs, path) in enumerate(ops):
        srcs = tuple(producer.get(v[1], "ext") for v in ins if isinstance(v, tuple) and v and v[0] == "t")
        out.append((name, srcs, path))
        for t in outs:
            producer[t] = k
    return out


def compare(ref: list[tuple[str, tuple[int | str, ...], str]], got: list[tuple[str, tuple[int | str, ...], str]]) -> str:
    names = [r[0] for r in ref] == [g[0] for g in got]
    first = next((f"#{i} {r[0]} vs {g[0]}" for i, (r, g) in enumerate(zip(ref, got, strict=False)) if r[0] != g[0]), "")
    same_edges = sum(1 for r, g in zip(ref, got, strict=False) if r[0] == g[0] and r[1] == g[1])
    same_mod = sum(1 for r, g in zip(ref, got, strict=False) if r[0] == g[0] and r[2] == g[2])
    return (f"ops {len(got)} vs {len(ref)} ({'same list' if names else 'differ at ' + first}); "
            f"op with same producers {same_edges}/{len(ref)}; same module {same_mod}/{len(ref)}")


def fidelity(model_name: str, model: Any, args: tuple[Any, ...]) -> None:
    ref = aten_reference(model, args)
    got_et = et_graph(et_run(model, args, scopes=True, read=True))
    print(f"{model_name}: execution trace vs eager-aten: {compare(ref, got_et)}")
    for i, (r, g) in enumerate(zip(ref, got_et, strict=False)):
        if r != g:
            print(f"  first difference #{i}: eager-aten {r} / trace {g}")
            break
    got_c = cext_run(model, args, scopes=True)
    print(f"{model_name}: C recorder vs eager-aten: {compare(ref, got_c)}")
    # the two known differences (below): torch.tensor()'s detach_ (in place: dropping it keeps the
    # producers right), and reshape's _reshape_alias, which a dispatch mode turns into view
    got_c = mode_like(cext_run(model, args, scopes=True, build=False), [n for n, _ in model.named_modules()])
    print(f"{model_name}: C recorder without detach_, _reshape_alias as view: {compare(ref, got_c)}")
    for i, (r, g) in enumerate(zip(ref, got_c, strict=False)):
        if r != g:
            print(f"  first difference #{i}: eager-aten {r} / C recorder {g}")
            break
    prof = prof_run(model, args, scopes=True, walk=True)
    names = [r[0] for r in ref] == [p[0] for p in prof]
    mods = sum(1 for r, p in zip(ref, prof, strict=False) if r[0] == p[0] and r[2] == p[2])
    print(f"{model_name}: profiler vs eager-aten: ops {len(prof)} vs {len(ref)} "
          f"({'same list' if names else 'differ'}); same module {mods}/{len(ref)}; outputs: not recorded")


# ---- timing -------------------------------------------------------------------------------------------------


def part_fns(model: Any, args: tuple[Any, ...]) -> dict[str, Callable[[], Any]]:
    import torch
    from tracer import floor_fn

    import fxviz

    names = module_names(model)

    def forward() -> None:
        with torch.no_grad():
            model(*args)

    return {
        "forward": forward,
        "floor": floor_fn(model, args),
        "hooks": lambda: with_hooks(lambda m, a: None, lambda m, a, o: None, forward),
        "scopes": lambda: with_hooks(*fast_scopes(names), forward),
        "prof-noscope": lambda: prof_run(model, args, scopes=False, walk=False),
        "prof-raw": lambda: prof_run(model, args, scopes=True, walk=False),
        "prof": lambda: prof_run(model, args, scopes=True, walk=True),
        "et-noscope": lambda: et_run(model, args, scopes=False, read=False),
        "et-raw": lambda: et_run(model, args, scopes=True, read=False),
        "et": lambda: et_run(model, args, scopes=True, read=True),
        "cext-noinputs": lambda: cext_run(model, args, scopes=False, inputs=False, build=False),
        "cext-noscope": lambda: cext_run(model, args, scopes=False, build=False),
        "cext-raw": lambda: cext_run(model, args, scopes=True, build=False),
        "cext": lambda: cext_run(model, args, scopes=True),
        "jit": lambda: jit_trace(model, args),
        "aten": lambda: fxviz.capture(model, args, method="eager-aten", passes=()),
    }


def quiet_fd2() -> None:
    """The execution trace observer logs two lines to stderr per start and stop."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)


def cpu_times(fns: dict[str, Callable[[], Any]], reps: int) -> dict[str, float]:
    for fn in fns.values():
        fn()
    got: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns)
    for i in range(reps):
        for k in order if i % 2 == 0 else reversed(order):
            t0 = time.process_time()
            fns[k]()
            got[k].append(time.process_time() - t0)
    return {k: med(v) for k, v in got.items()}


def child(model_name: str, part: str, reps: int, layers: int) -> None:
    """Run ``part`` under callgrind's collection (this process is the one valgrind runs)."""
    pin_threads(1)
    from tracer import build_models

    model, args, _ = build_models(layers)[model_name]()
    fn = part_fns(model, args)[part]
    for _ in range(2):
        fn()
    functools.reduce(lambda acc, _: fn(), range(reps), None)


def count(model_name: str, part: str, reps: int, layers: int) -> int:
    return callgrind_count(__file__, model_name, part, reps, layers)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        quiet_fd2()
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="stack,gpt2-narrow")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--stack-layers", type=int, default=300)
    ap.add_argument("--instructions", default="", help="parts to count with callgrind (slow), e.g. forward,floor,et")
    ap.add_argument("--fidelity", action="store_true")
    a = ap.parse_args()
    pin_threads(1)
    from tracer import build_models

    builders = build_models(a.stack_layers)
    parts = a.parts.split(",")
    rows = []
    for model_name in a.models.split(","):
        model, args, _ = builders[model_name]()
        if a.fidelity:
            fidelity(model_name, model, args)
        fns = {k: v for k, v in part_fns(model, args).items() if k in parts}
        cpu = cpu_times(fns, a.reps) if a.reps else {}
        ins = {}
        for p in filter(None, a.instructions.split(",")):
            ins[p] = count(model_name, p, 1, a.stack_layers)
            print(f"{model_name} {p}: {ins[p]} instructions", file=sys.stderr, flush=True)
        ops = a.stack_layers * STACK_OPS_PER_LAYER if model_name == "stack" else None
        for p in parts:
            row = [model_name, p]
            if cpu:
                row += [f"{cpu[p] * 1e3:.2f}", f"{cpu[p] / cpu['forward']:.2f}x",
                        f"{(cpu[p] - cpu['forward']) / ops * 1e6:.1f}" if ops else "-"]
            if ins:
                n = ins.get(p)
                row += [f"{n / 1e6:.1f} M" if n else "-",
                        f"{(n - ins['forward']) / ops / 1e3:.1f} k" if n and ops and "forward" in ins else "-"]
            rows.append(row)
    headers = ["model", "part"]
    if a.reps:
        headers += ["CPU ms", "x forward", "µs/op beyond forward"]
    if a.instructions:
        headers += ["instructions", "per op beyond forward"]
    print(table(headers, rows))
    if os.path.exists(ET_PATH):
        os.remove(ET_PATH)
    return 0


if __name__ == "__main__":
    sys.exit(main())
