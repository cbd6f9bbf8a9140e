"""``compile_map``: run a model under torch.compile, record what Dynamo did, and lay it over the
eager graph. Needs torch."""

from __future__ import annotations

import contextlib
import functools
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from fxviz.analyze.compilemap.autograd import write_backward
from fxviz.analyze.compilemap.backward import Autograd as _Autograd
from fxviz.analyze.compilemap.breaks import RESUME, category, ended_at, group_breaks
from fxviz.analyze.compilemap.failed import FailedFrames
from fxviz.analyze.compilemap.kinds import EAGER, UNRUN
from fxviz.analyze.compilemap.limit import LimitWatch, limits, refused
from fxviz.analyze.compilemap.match import assign, pair
from fxviz.analyze.compilemap.opcount import no_eager_op
from fxviz.analyze.compilemap.overlay import module_coverage, report_notes, write
from fxviz.analyze.compilemap.record import (
    GuardFailRecord,
    Recorder,
    Recording,
    compiled_graph,
    dynamo_state,
    module_paths,
    recompile_fails,
)
from fxviz.analyze.compilemap.result import CompileMap, Recompile, RecompileLimit
from fxviz.analyze.compilemap.skim import Arithmetic, eager_graph
from fxviz.analyze.compilemap.traced import TracedLines
from fxviz.analyze.flops import CAPTURE_PASSES
from fxviz.analyze.inside.live import LiveRun
from fxviz.errors import InputError, ModelError, TargetError
from fxviz.fallback.backward import trace_backward
from fxviz.fallback.trace import trace_eager
from fxviz.ir import Attempt, Graph
from fxviz.passes import run_passes
from fxviz.progress import stage
from fxviz.text import one_line
from fxviz.torchbridge.distributed import wait_collectives
from fxviz.torchbridge.guard import ModelState
from fxviz.torchbridge.lazy import initialised
from fxviz.torchbridge.normalize import flatten_inputs
from fxviz.torchbridge.run import gc_paused, normalize_args, quiet_torch

InputSet = tuple[tuple[Any, ...], dict[str, Any]]


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
    inside: bool = False,
    activation_memory_budget: float | None = None,
    compiled_autograd: bool = False,
) -> CompileMap:
    """Compile ``model`` with ``torch.compile(backend=..., mode=..., dynamic=...)``, run it on
    ``args``/``kwargs`` and then on each further input set of ``inputs`` (each a tuple of
    positional inputs, or ``(args, kwargs)``), and return the :class:`CompileMap`: the eager graph
    of the first input set with each op marked by the compiled graph that ran it, the graph breaks
    grouped by cause and line, and the recompiles (one per compile torch made again: its compile id,
    input set and failed guard).

    The compiled run comes first and sees the model as the user's first call would (a model that
    initialises itself on its first call, ``if self.scale is None: ...``, breaks there as it does
    for the user); the eager trace of the first input set follows, on the model as it was before
    the compiled run. Between the runs and after them the model is put back as it was found
    (:class:`~fxviz.torchbridge.guard.ModelState`, the same state every capture attempt puts back:
    every module's ``__dict__`` and the containers reachable from it, its parameters, buffers and
    tensor attributes by identity, buffers and tensor attributes by value, FSDP2's own state;
    parameters a compiled graph writes in place are copied just before its first call and put
    back). Both runs are under ``torch.no_grad()`` unless ``grad=True``. An ``OptimizedModule``
    (what ``torch.compile(model)`` returns) is unwrapped to the model it wraps (a note says so).
    Where Dynamo broke no graph and the forward's convolutions and matrix products cost more than
    skipping them adds, the eager trace skips their kernels (:mod:`~fxviz.analyze.compilemap.skim`).
    Dynamo's caches are reset before and after the run (so the user's other compiled functions
    compile again on their next call), its config and counters restored.

    When Dynamo hits its recompile limit (``torch._dynamo.config.recompile_limit``, 8) it stops
    compiling the function and runs it eagerly: ``cm.limits`` says where, from which input set,
    the input sets it ran eagerly in (``cm.eager_sets``) and the recompile reasons that led there;
    the header is marked and a note says what to change.

        >>> cm = compile_map(model, (x,), backend="aot_eager")   # tests/compile_models.py:item_break
        >>> cm.header()
        '4 graphs, 1 break (1 cause), 89% of ops compiled (8/9)  ·  backend aot_eager'
        >>> cm.assigned["linear"], cm.assigned["item"], cm.breaks[0].line_text(), cm.breaks[0].category
        ('g0', 'eager', 'compile_models.py:27', 'item')

    With ``inside=True`` (any backend but ``eager``: the kernels are Inductor's), the compiled run
    is recorded with torch's structured trace and ``cm.inside`` holds what AOT Autograd and
    Inductor did to each compiled graph: its stages, every kernel and extern call with the eager
    ops and modules it runs and its time (torch.profiler over
    :data:`fxviz.analyze.inside.live.ITERATIONS` warm iterations), and the compile cost
    (:mod:`fxviz.analyze.inside`); with ``grad=True`` the first input set's outputs are
    differentiated once so the backward compiles and is timed too, and each graph's
    ``partition`` says which forward values the backward saves and which ops it recomputes
    (``activation_memory_budget``: torch._functorch.config's, for the run).

    With ``compiled_autograd=True`` (and ``grad=True``) the first input set's forward and backward
    run under compiled autograd (what ``torch._dynamo.config.compiled_autograd = True`` does in a
    compiled training step), the backward's graphs compiled by the same recording backend:
    ``cm.backward`` holds the graphs compiled autograd captured (torch's ``compiled_autograd_graph``
    records), each autograd node they run with the modules whose forward it differentiates, the
    Dynamo graphs compiled from them and their breaks (:mod:`fxviz.analyze.compilemap.autograd`).

    A model that raises under torch.compile (but not eagerly) is a
    :class:`~fxviz.errors.ModelError` that chains torch's exception; one that raises eagerly too
    is the eager trace's :class:`~fxviz.errors.ModelError`.
    """
    notes: list[str] = []
    orig = getattr(model, "_orig_mod", None)
    if isinstance(orig, nn.Module) and type(model).__name__ == "OptimizedModule":
        notes.append(f"the target is torch.compile'd: its original module ({type(orig).__name__}) is analysed, "
                     "its own compiled code is not used")
        model = orig
    if mode is not None and backend != "inductor":  # before any run, as every refusal of options
        raise TargetError(f"mode {mode!r} applies to the inductor backend only, not {_name(backend)!r}: leave --mode out")
    if inside and _name(backend) == "eager":
        raise TargetError("inside=True reads AOT Autograd's and Inductor's records: use backend='inductor' or "
                          "'aot_eager', not 'eager'")
    if activation_memory_budget is not None and not (inside and grad):
        raise TargetError("activation_memory_budget changes what the backward saves: add grad=True, inside=True")
    if compiled_autograd and not grad:
        raise TargetError("compiled_autograd=True compiles the backward: add grad=True (--backward)")
    if compiled_autograd and inside:
        raise TargetError("compiled_autograd=True is not covered with inside=True (Inductor's kernels of the compiled "
                          "autograd graph): leave inside out")
    live = LiveRun(grad=grad, budget=activation_memory_budget) if inside else None
    autograd = _Autograd() if compiled_autograd else None
    args, kwargs = normalize_args(model, args, kwargs)
    # lazy modules wait for a first forward: it runs on a copy, which is analysed (torch.compile would
    # turn the model's LazyLinear into a Linear, which no snapshot of its attributes undoes)
    model, lazy = initialised(model, args, kwargs)
    notes += lazy
    sets: list[InputSet] = [(args, kwargs)] + [_input_set(model, i, k) for k, i in enumerate(inputs or (), 1)]

    state = ModelState(model, ())  # the model as the user's first call finds it, for both runs
    try:
        t1 = time.perf_counter()
        recorder = Recorder(backend, mode, dynamic, module_paths(model))
        if live is not None and backend == "aot_eager":  # torch's module of each AOT node, into the trace
            from fxviz.torchbridge.modulerecord import aot_eager_recorded

            recorder.real = aot_eager_recorded(recorder.paths)
        arithmetic = Arithmetic(recorder)
        watch = LimitWatch()
        traced = TracedLines(recorder.rec)
        try:
            with traced.kept():
                _run_compiled(model, recorder, watch, sets, grad, _name(backend), live, autograd)
        except ModelError:
            recorder.backups.restore()
            state.restore()
            trace_eager(model, args, kwargs, level="function", grad=grad)  # a model that fails eagerly says so
            raise
        compile_s = time.perf_counter() - t1
        watch.name_graphs(recorder.rec)

        recorder.backups.restore()  # the eager trace starts from the parameters the compiled run found
        state.restore()
        t0 = time.perf_counter()
        stage("tracing the eager forward")
        graph = eager_graph(model, args, kwargs, grad, state, skim=not recorder.rec.breaks and arithmetic.worth_skimming())
        trace_s = time.perf_counter() - t0
    finally:
        state.restore()
    graph.attempts = [Attempt("eager", True, trace_s)]
    graph = run_passes(graph, CAPTURE_PASSES)

    t2 = time.perf_counter()
    with gc_paused():  # a few objects per op: no full collections over what compiling left behind
        stage("matching the eager ops to the compiled graphs")
        hit = limits(watch.hits, recorder.rec, len(sets), watch.run_only)
        cmap = build(graph, recorder.rec, backend=_name(backend), mode=mode, dynamic=dynamic, input_sets=len(sets),
                     notes=notes + [lim.note() for lim in hit], limits=hit, traced=traced)
        if live is not None:
            _inside(cmap, live, recorder.rec)
    if autograd is not None:
        state.restore()
        try:
            stage("tracing the eager backward")
            eager_bw = trace_backward(model, args, kwargs)
        finally:
            state.restore()
        with gc_paused():
            cmap.backward = autograd.build(recorder.rec, graph, eager_bw)
            write_backward(cmap)
    cmap.timings = {"trace_s": trace_s, "compile_s": compile_s, "analysis_s": time.perf_counter() - t2}
    return cmap


def _inside(cmap: CompileMap, live: LiveRun, rec: Recording) -> None:
    """Read the run's structured trace, build what happened inside each compiled graph, time its
    kernels and write the overlays (``kernel``, ``kernel time``) and panels."""
    from fxviz.analyze.inside import overlay
    from fxviz.analyze.inside.build import build as build_inside
    from fxviz.tracefile import read_events

    stage("reading what AOT Autograd and Inductor recorded")
    trace = read_events(live.events)
    inside = build_inside(trace, eager_ops=dynamo_to_eager(cmap.graph, rec), eager=cmap.graph)
    live.apply(trace, inside)
    cmap.inside = inside
    overlay.write(cmap.graph, inside)
    head = cmap.graph.annotations.get("headline")
    if isinstance(head, dict):  # the report opens with the answer, inside's summary and notes included
        head["text"] = cmap.headline()
        if notes := report_notes(cmap):
            head["notes"] = notes
        if "kernel" in (cmap.graph.annotations.get("overlays") or {}):
            head["overlay"] = "kernel"


def dynamo_to_eager(graph: Graph, rec: Recording) -> dict[str, dict[str, str]]:
    """Graph id -> Dynamo node name -> the eager op it is, from the first input set's first run of
    each graph (:func:`~fxviz.analyze.compilemap.match.pair`, the matching the map is built on)."""
    runs = [(rec.graphs[g].id, rec.graphs[g].ops) for g, k in rec.runs if k == 0 and rec.forward(g)]
    ops = graph.ops
    out: dict[str, dict[str, str]] = {}
    for (gid, dops), row in zip(runs, pair(ops, runs), strict=True):
        if gid in out:
            continue
        out[gid] = {d.node: ops[i].name for d, i in zip(dops, row, strict=True) if i is not None and d.node}
    return out


def _run_compiled(model: nn.Module, recorder: Recorder, watch: LimitWatch, sets: Sequence[InputSet],
                  grad: bool, backend: str, live: LiveRun | None = None, autograd: _Autograd | None = None) -> None:
    """Run each input set through ``model`` compiled with ``recorder``'s backend, Dynamo reset
    before and after; with ``live``, under torch's structured trace, then the first input set
    again, warm, under torch.profiler (the runs it records are taken back)."""
    failed = FailedFrames(recorder.rec)  # the frames whose compile failed: Dynamo ran them eagerly
    with dynamo_state(), recorder.breaks_logged(), failed.kept(), quiet_torch(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Dynamo warns of some breaks too: they are in the map
        compiled = recorder.compile(model)
        recorder.names = [dict(zip(map(id, f.tensors), f.names, strict=True)) for f in (flatten_inputs(model, a, kw) for a, kw in sets)]
        grad_mode = contextlib.nullcontext() if grad else torch.no_grad()
        leaves = [p for p in model.parameters()] + [t for t in pytree.tree_leaves(sets[0]) if isinstance(t, torch.Tensor)]
        recording = live.recording() if live is not None else autograd.recording() if autograd is not None \
            else contextlib.nullcontext()
        with grad_mode, recording:
            _run_sets(compiled, recorder, watch, sets, backend, live, leaves, autograd, failed)
        if live is not None:
            rec = recorder.rec
            runs, counts, now = len(rec.runs), [g.runs for g in rec.graphs], rec.input_set
            rec.input_set = -1
            a, kw = sets[0]
            with grad_mode:
                stage("timing the compiled kernels (torch.profiler)")
                live.profile(lambda: wait_collectives(compiled(*a, **kw)), leaves)
            del rec.runs[runs:]
            for g, n in zip(rec.graphs, counts, strict=False):
                g.runs = n
            rec.input_set = now


def _run_sets(compiled: Callable[..., Any], recorder: Recorder, watch: LimitWatch, sets: Sequence[InputSet],
              backend: str, live: LiveRun | None, leaves: list[torch.Tensor], autograd: _Autograd | None = None,
              failed: FailedFrames | None = None) -> None:
    """Each input set through the compiled model (and, with ``live`` and ``grad``, the first
    set's backward; with ``autograd``, the first set's forward and backward under compiled
    autograd)."""
    for k, (a, kw) in enumerate(sets):
        recorder.rec.input_set = k
        stage("running the compiled model" + (f", input set {k + 1} of {len(sets)}" if len(sets) > 1 else ""))
        watch.start()
        try:
            if autograd is not None and k == 0:
                autograd.run(functools.partial(compiled, *a, **kw), recorder, leaves)
            else:
                out = compiled(*a, **kw)
                wait_collectives(out)  # a sharded model's compiled output may be unwaited, as eager's
                if live is not None and k == 0:
                    live.backward(out, leaves)
            if failed is not None:
                failed.take()  # the frames Dynamo ran eagerly in this input set
        except Exception as e:  # told from an eager failure by the caller
            watch.stop()
            raise ModelError(
                f"the model raised under torch.compile(backend={backend!r}) on input set {k}: "
                f"{type(e).__name__}: {one_line(str(e), limit=300)} (--backend eager tells Dynamo's "
                "failures from the backend's)") from e
        watch.done(k)


def _name(backend: str | Callable[..., Any]) -> str:
    return backend if isinstance(backend, str) else str(getattr(backend, "__name__", "custom"))


def build(graph: Graph, rec: Recording, *, backend: str, mode: str | None, dynamic: bool | None,
          input_sets: int = 1, notes: Sequence[str] = (), limits: Sequence[RecompileLimit] = (),
          traced: TracedLines | None = None) -> CompileMap:
    """The map from a recording: match, group, write the overlays and panels. ``limits``: the
    recompile limits Dynamo hit (their refused recompiles are not recompiles); ``traced``: the lines
    Dynamo traced, which tell the ops a broken forward did not run under torch.compile."""
    runs = [(rec.graphs[g].id, rec.graphs[g].ops) for g, k in rec.runs if k == 0 and rec.forward(g)]
    ops = graph.ops
    rows = pair(ops, runs)
    filled: set[int] = set()
    claimed: set[tuple[int, int]] = set()
    hits = assign(ops, runs, rows=rows, filled=filled, claimed=claimed)
    assigned = {n.name: hits[n.name][0] if n.name in hits else EAGER for n in ops}
    notes = list(notes)
    if runs and not any(lim.input_set == 0 for lim in limits):
        # no break, no frame Dynamo ran eagerly: the forward ran inside its graphs, whole, and an
        # op none holds did not run under torch.compile (a path the forward takes only eagerly);
        # with breaks: an op on a line Dynamo never traced in a function it traced (:mod:`.traced`)
        # (an op the matching filled into a graph as folded away, on a line Dynamo never traced, too)
        broke = any(b.input_set == 0 and b.phase == "forward" for b in rec.breaks)
        unrun = traced.unrun(ops, assigned, UNRUN, filled={ops[i].name for i in filled}) if traced is not None else []
        if not broke:
            untraced = {n.name for n in unrun}
            unrun = [n for n in ops if assigned[n.name] == EAGER or n.name in untraced]
        assigned.update((n.name, UNRUN) for n in unrun)
        if unrun:
            at = ", ".join(dict.fromkeys(f"{n.source.file.rsplit('/', 1)[-1]}:{n.source.line}" if n.source else n.name
                                         for n in unrun))
            notes.append(f"{len(unrun)} op{'s' * (len(unrun) != 1)} of the eager forward did not run under "
                         f"torch.compile (at {at}): the forward takes another path when compiling "
                         "(torch.compiler.is_compiling()); not counted in the share compiled")
    tree = graph.calls
    graphs = [compiled_graph(g) for g in rec.graphs if g.phase == "forward"]
    if only := no_eager_op(graphs, runs, rows, claimed, assigned):
        notes.append(only)
    forward = [b for b in rec.breaks if b.phase == "forward"]
    cmap = CompileMap(graph=graph, backend=backend, mode=mode, dynamic=dynamic, graphs=graphs,
                      breaks=group_breaks(forward, graph, tree, assigned, _resumed(rec), ended=ended_at(rec)), recompiles=recompiles(rec.guard_fails, refused(limits)),
                      assigned=assigned, modules=module_coverage(graph, assigned), input_sets=input_sets,
                      notes=notes, limits=list(limits))
    write(cmap)
    return cmap


def _resumed(rec: Recording) -> dict[tuple[str, int], int]:
    """(function, line) -> how often the first input set resumed after a break there: Dynamo names
    the function it resumes in ``torch_dynamo_resume_in_forward_at_27``."""
    out: dict[tuple[str, int], int] = {}
    for g, k in rec.runs:
        m = RESUME.fullmatch(rec.graphs[g].func) if rec.forward(g) else None
        if k == 0 and m:
            key = (m.group(1), int(m.group(2)))
            out[key] = out.get(key, 0) + 1
    return out


def recompiles(fails: Sequence[GuardFailRecord],
               refused: Callable[[GuardFailRecord], bool] = lambda f: False) -> list[Recompile]:
    """One recompile per compile torch made again, in order (however often a function recompiled
    in one input set): its compile id and the guard torch records as its reason
    (:func:`~fxviz.analyze.compilemap.record.recompile_fails`); none where the recompile limit
    refused it (``refused``: nothing was compiled)."""
    return [Recompile(f.input_set, f.func, f.file, f.line, f.reason, f.guard, f.input, f.dim, f.advice, f.compile_id)
            for f in recompile_fails(fails) if not refused(f)]


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


__all__ = ["build", "category", "compile_map", "group_breaks", "recompiles"]
