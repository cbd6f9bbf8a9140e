"""``compile_map``: run a model under torch.compile, record what Dynamo did, and lay it over the
eager graph. Needs torch."""

from __future__ import annotations

import contextlib
import re
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from fxviz.analyze.compilemap.breaks import category, group_breaks
from fxviz.analyze.compilemap.match import assign
from fxviz.analyze.compilemap.overlay import EAGER, module_coverage, write
from fxviz.analyze.compilemap.record import (
    GuardFailRecord,
    Recorder,
    Recording,
    dynamo_state,
    module_paths,
)
from fxviz.analyze.compilemap.result import CompiledGraph, CompileMap, Recompile
from fxviz.analyze.flops import CAPTURE_PASSES
from fxviz.errors import InputError, ModelError
from fxviz.fallback.trace import trace_eager
from fxviz.ir import Attempt, Graph
from fxviz.passes import run_passes
from fxviz.text import one_line
from fxviz.torchbridge.run import gc_paused, normalize_args, quiet_torch

InputSet = tuple[tuple[Any, ...], dict[str, Any]]
_RESUME = re.compile(r"torch_dynamo_resume_in_(.+)_at_(\d+)")


def compile_map(
    model: nn.Module,
    args: Any = (),
    kwargs: dict[str, Any] | None = None,
    *,
    backend: str | Callable[..., Any] = "inductor",
    mode: str | None = None,
    dynamic: bool | None = None,
    inputs: Sequence[Any] | None = None,
    grad: bool = False,
) -> CompileMap:
    """Compile ``model`` with ``torch.compile(backend=..., mode=..., dynamic=...)``, run it on
    ``args``/``kwargs`` and then on each further input set of ``inputs`` (each a tuple of
    positional inputs, or ``(args, kwargs)``), and return the :class:`CompileMap`: the eager graph
    of the first input set with each op marked by the compiled graph that ran it, the graph breaks
    grouped by cause and line, and the recompiles.

    Both runs (the eager trace and the compiled run) are under ``torch.no_grad()`` unless
    ``grad=True``. An ``OptimizedModule`` (what ``torch.compile(model)`` returns) is unwrapped to
    the model it wraps (a note says so). Dynamo's caches are reset before and after the run (so the
    user's other compiled functions compile again on their next call), its config and counters
    restored, and the model's buffers and training flags restored.

        >>> cm = compile_map(model, (x,), backend="aot_eager")   # tests/compile_models.py:item_break
        >>> cm.header()
        '4 graphs, 1 break (1 cause), 89% of ops compiled (8/9)  ·  backend aot_eager'
        >>> cm.assigned["linear"], cm.assigned["item"], cm.breaks[0].line_text(), cm.breaks[0].category
        ('g0', 'eager', 'compile_models.py:27', 'item')

    A model that raises under torch.compile (but not eagerly) is a
    :class:`~fxviz.errors.ModelError` that chains torch's exception.
    """
    notes: list[str] = []
    orig = getattr(model, "_orig_mod", None)
    if isinstance(orig, nn.Module) and type(model).__name__ == "OptimizedModule":
        notes.append(f"the target is torch.compile'd: its original module ({type(orig).__name__}) is analysed, "
                     "its own compiled code is not used")
        model = orig
    args, kwargs = normalize_args(model, args, kwargs)
    sets: list[InputSet] = [(args, kwargs)] + [_input_set(model, i, k) for k, i in enumerate(inputs or (), 1)]

    t0 = time.perf_counter()
    graph = trace_eager(model, args, kwargs, level="function", grad=grad)
    trace_s = time.perf_counter() - t0
    graph.attempts = [Attempt("eager", True, trace_s)]
    graph = run_passes(graph, CAPTURE_PASSES)

    t1 = time.perf_counter()
    recorder = Recorder(backend, mode, dynamic, module_paths(model))
    with dynamo_state(), _model_state(model), recorder.breaks_logged(), quiet_torch(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Dynamo warns of some breaks too: they are in the map
        compiled = recorder.compile(model)
        grad_mode = contextlib.nullcontext() if grad else torch.no_grad()
        with grad_mode:
            for k, (a, kw) in enumerate(sets):
                recorder.rec.input_set = k
                try:
                    compiled(*a, **kw)
                except Exception as e:  # the eager forward ran: this is torch.compile's failure on it
                    raise ModelError(
                        f"the model raised under torch.compile(backend={_name(backend)!r}) on input set {k}: "
                        f"{type(e).__name__}: {one_line(str(e), limit=300)} (--backend eager tells Dynamo's "
                        "failures from the backend's)") from e
    compile_s = time.perf_counter() - t1

    t2 = time.perf_counter()
    with gc_paused():  # a few objects per op: no full collections over what compiling left behind
        cmap = build(graph, recorder.rec, backend=_name(backend), mode=mode, dynamic=dynamic, input_sets=len(sets), notes=notes)
    cmap.timings = {"trace_s": trace_s, "compile_s": compile_s, "analysis_s": time.perf_counter() - t2}
    return cmap


def _name(backend: str | Callable[..., Any]) -> str:
    return backend if isinstance(backend, str) else str(getattr(backend, "__name__", "custom"))


def build(graph: Graph, rec: Recording, *, backend: str, mode: str | None, dynamic: bool | None,
          input_sets: int = 1, notes: Sequence[str] = ()) -> CompileMap:
    """The map from a recording: match, group, write the overlays and panels."""
    runs = [(rec.graphs[g].id, rec.graphs[g].ops) for g, k in rec.runs if k == 0]
    ops = graph.ops
    hits = assign(ops, runs)
    assigned = {n.name: hits[n.name][0] if n.name in hits else EAGER for n in ops}
    tree = graph.calls
    graphs = [CompiledGraph(g.id, g.func, g.file, g.line, g.input_set, len(g.ops), g.runs, round(g.compile_s, 4),
                            sorted({o.module for o in g.ops if o.module}), list(g.guards), g.inputs, g.symbols,
                            g.shape_guards)
              for g in rec.graphs]
    cmap = CompileMap(graph=graph, backend=backend, mode=mode, dynamic=dynamic, graphs=graphs,
                      breaks=group_breaks(rec.breaks, graph, tree, assigned, _resumed(rec)), recompiles=recompiles(rec.guard_fails),
                      assigned=assigned, modules=module_coverage(graph, assigned), input_sets=input_sets,
                      notes=list(notes))
    write(cmap)
    return cmap


def _resumed(rec: Recording) -> dict[tuple[str, int], int]:
    """(function, line) -> how often the first input set resumed after a break there: Dynamo names
    the function it resumes in ``torch_dynamo_resume_in_forward_at_27``."""
    out: dict[tuple[str, int], int] = {}
    for g, k in rec.runs:
        m = _RESUME.fullmatch(rec.graphs[g].func)
        if k == 0 and m:
            key = (m.group(1), int(m.group(2)))
            out[key] = out.get(key, 0) + 1
    return out


def recompiles(fails: Sequence[GuardFailRecord]) -> list[Recompile]:
    """One recompile per function and input set: the first guard that failed (Dynamo checks the
    newest compiled version first)."""
    seen: set[tuple[int, str, str, int]] = set()
    out = []
    for f in fails:
        key = (f.input_set, f.func, f.file, f.line)
        if key in seen:
            continue
        seen.add(key)
        out.append(Recompile(f.input_set, f.func, f.file, f.line, f.reason, f.guard, f.input, f.dim, f.advice))
    return out


def _input_set(model: nn.Module, value: Any, k: int) -> InputSet:
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict) and isinstance(value[0], tuple):
        a, kw = value
    elif isinstance(value, dict):
        a, kw = (), value
    else:
        a, kw = value, None
    try:
        return normalize_args(model, a, kw)
    except InputError as e:
        raise InputError(f"input set {k}: {e}") from e


@contextlib.contextmanager
def _model_state(model: nn.Module) -> Iterator[None]:
    """The compiled run is a real forward: put buffers (BatchNorm statistics) and training flags back."""
    training = [(m, m.training) for m in model.modules()]
    buffers = [(b, b.detach().clone()) for b in model.buffers() if not b.is_meta]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, saved in buffers:
                if b.shape == saved.shape:
                    b.copy_(saved)
        for m, flag in training:
            m.training = flag


__all__ = ["build", "category", "compile_map", "group_breaks", "recompiles"]
