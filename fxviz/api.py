"""The public entry points: :func:`capture` and :func:`compare`. This is where capture methods are
chosen and chained: ``capture`` (symbolic) and ``fallback`` (eager) are siblings that each produce
a graph; the auto chain tries them in turn and records every attempt."""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.export import Dim

from fxviz.analyze.flops import CAPTURE_PASSES  # the default passes and flops (registers the pass)
from fxviz.errors import CaptureError, CollectiveTimeout, InputError, ModelError, TargetError
from fxviz.fallback.trace import meta_sharded, trace_eager, uses_meta
from fxviz.graphdiff import Diff, diff
from fxviz.ir import Attempt, Graph
from fxviz.passes import run_passes
from fxviz.progress import stage
from fxviz.symbolic.export import capture_export
from fxviz.symbolic.fx import capture_fx
from fxviz.torchbridge.apart import can_fork, run_apart, worth_isolating
from fxviz.torchbridge.checks import RejectedInputs, count_ops, forget_failed_compiles, real_inputs
from fxviz.torchbridge.fastpath import fast_path_notes
from fxviz.torchbridge.guard import walks_shared
from fxviz.torchbridge.lazy import initialised
from fxviz.torchbridge.normalize import flatten_inputs
from fxviz.torchbridge.run import capture_session, failed_attempt, gc_paused, interrupts_kept, normalize_args
from fxviz.torchbridge.values import add_unread_state, module_infos
from fxviz.training import FATAL, training_methods

Capturer = Callable[[nn.Module, tuple[Any, ...], dict[str, Any], Any, bool], Graph]


def _eager(level: str) -> Capturer:
    """The eager tracer as a capturer; fake tensors when the model or an input is on ``meta``, but
    not for a model on ``meta`` given real inputs (when inputs are checked): those cannot run
    together, and the error says so where a fake graph would hide it."""

    def run(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], _ds: Any, validate: bool) -> Graph:
        fake = uses_meta(model, args, kwargs)
        if fake and validate and not meta_sharded(model):
            tensors = flatten_inputs(model, args, kwargs).tensors
            fake = not tensors or not real_inputs(tensors)
        return trace_eager(model, args, kwargs, level=level, fake=fake)

    return run


#: Every capture method by name: ``(model, args, kwargs, dynamic_shapes, validate) -> Graph``.
CAPTURERS: dict[str, Capturer] = {
    "export": lambda m, a, k, ds, v: capture_export(m, a, k, strict=False, dynamic_shapes=ds, validate=v),
    "export-strict": lambda m, a, k, ds, v: capture_export(m, a, k, strict=True, dynamic_shapes=ds, validate=v),
    "export-decomposed": lambda m, a, k, ds, v: capture_export(m, a, k, dynamic_shapes=ds, decompose=True,
                                                               validate=v),
    "fx": lambda m, a, k, ds, v: capture_fx(m, a, k, validate=v),
    "eager": _eager("function"),
    "eager-aten": _eager("aten"),
}

#: The methods that trace symbolically (and may run apart, in a child process).
SYMBOLIC = frozenset({"export", "export-strict", "export-decomposed", "fx"})

#: What ``method="auto"`` tries, in order.
AUTO_CHAIN: tuple[str, ...] = ("export", "export-strict", "fx", "eager")

#: Every value ``capture(method=...)`` takes (the CLI's ``--method`` choices come from here).
METHODS: tuple[str, ...] = ("auto", *CAPTURERS)

#: Failures of export that mean a Python decision on tensor data (``if x.sum() > 0``, a size read
#: with ``.item()``, a boolean mask's count): no symbolic method can make it.
DATA_DEPENDENT_ERRORS = frozenset({
    "GuardOnDataDependentSymNode", "DataDependentOutputException", "DynamicOutputShapeException",
})


def skip_reason(method: str, attempts: Sequence[Attempt]) -> str | None:
    """Why ``method`` cannot succeed after the failures in ``attempts``, or ``None`` to try it.

    After non-strict export stopped on a decision on tensor data, strict export (Dynamo) stops on
    the same line, and fx, which runs the same Python with proxies in place of tensors (and fake
    tensors without a shape environment for shapes), cannot make it either; they cost up to 70% of a
    detection model's capture before they fail. After export's graph failed on the example inputs
    while the model ran them, strict export builds the same graph."""
    failure = next((a for a in attempts if a.method == "export" and not a.ok and not a.skipped), None)
    if failure is None or method not in ("export-strict", "fx"):
        return None
    at = f" at {failure.source.short()}" if failure.source is not None else ""
    if failure.error_type in DATA_DEPENDENT_ERRORS:
        why = ("strict export (Dynamo) stops on the same line" if method == "export-strict" else
               "fx traces the same Python with proxies in place of tensors and cannot make that decision either")
        return f"export stopped on a decision on tensor data ({failure.error_type}){at}; {why}"
    if failure.error_type == RejectedInputs.__name__ and method == "export-strict":
        return "export's graph does not run on these inputs while the model does; strict export builds the same graph"
    return None


def unwrap(model: Any) -> tuple[Any, list[str]]:
    """The module a wrapper holds (``torch.compile``'s ``OptimizedModule``, ``nn.DataParallel``,
    ``DistributedDataParallel``), with a note per wrapper taken off: a capture shows the model
    itself, its inputs named by its own forward and its modules at their own paths."""
    notes: list[str] = []
    compiled = sys.modules.get("torch._dynamo.eval_frame")  # loaded whenever a model was compiled
    optimized = getattr(compiled, "OptimizedModule", None)
    for _ in range(16):  # wrappers nest a few levels at most
        if optimized is not None and isinstance(model, optimized):
            inner, what = model._orig_mod, "torch.compile"
        elif isinstance(model, nn.DataParallel | nn.parallel.DistributedDataParallel):
            inner, what = model.module, type(model).__name__
        else:
            break
        notes.append(f"unwrapped {type(model).__name__} ({what}): captured the {type(inner).__name__} it holds")
        model = inner
    return model, notes


def _refuse_scripted(model: nn.Module) -> None:
    if isinstance(model, torch.jit.ScriptModule):
        raise InputError(
            f"{type(model).__name__} is a TorchScript module (torch.jit.script or torch.jit.trace), whose "
            "forward Python cannot trace: pass the original nn.Module you scripted"
        )


def run_methods(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    methods: Sequence[str],
    dynamic_shapes: Any = None,
    validate: bool = True,
    isolate: bool | None = None,
    capturers: Mapping[str, Capturer] = CAPTURERS,
    fatal: tuple[type[BaseException], ...] = (),
) -> Graph:
    """Try ``methods`` in order (by name in ``capturers``); the first graph wins. An error in
    ``fatal`` (bad input no method gets past) is raised as it is. Raises :class:`CaptureError` listing every
    attempt when none works, or the :class:`ModelError` of a method that ran the model and saw the
    model itself raise (its partial graph records the attempts).

    A method that cannot succeed for the reason an earlier one failed is recorded as skipped
    (:func:`skip_reason`; only in a chain: a method asked for alone always runs). A graph that
    holds no op while the model ran ops is a failure. When a symbolic graph does not run on the
    example inputs, the eager tracer tells whether the model itself rejects them (its partial
    graph then comes with the :class:`ModelError`); if not, the attempt failed, and the eager
    graph serves the chain's ``eager`` attempt.

    Symbolic attempts run in a forked child when ``isolate`` says so (``None``: for a model of
    ``ISOLATE_FROM_MODULES`` modules or more, where fork is safe; :mod:`fxviz.torchbridge.apart`),
    so that what export keeps alive after it returns is given back when the child exits."""
    # only symbolic attempts run apart: an eager capture does not walk the model to decide
    apart = (any(m in SYMBOLIC for m in methods) and can_fork()
             and (worth_isolating(model) if isolate is None else isolate))
    attempts: list[Attempt] = []
    checked: tuple[Graph, float] | None = None  # the eager graph made to check the inputs
    # one snapshot before the first attempt, restored after each (model, inputs, process)
    with capture_session(model, args, kwargs) as session:
        for method in methods:
            reason = skip_reason(method, attempts) if len(methods) > 1 else None
            if reason is not None:
                attempts.append(Attempt(method, False, message=reason, skipped=True))
                continue
            if method == "eager" and checked is not None:
                graph, seconds = checked
                attempts.append(Attempt(method, True, seconds))
                graph.attempts = attempts
                return graph
            t0 = time.perf_counter()
            tried = [a.method for a in attempts if not a.skipped]
            stage(f"trying {method}" + (f" ({', '.join(tried)} failed)" if tried else ""))
            try:
                with session.attempt(), forget_failed_compiles():
                    capturer = functools.partial(capturers[method], model, args, kwargs, dynamic_shapes, validate)
                    if apart and method in SYMBOLIC:
                        graph = run_apart(capturer, functools.partial(failed_attempt, method, 0.0))
                    else:
                        session.borrowed = session.borrowed or method in SYMBOLIC
                        graph = capturer()
            except ModelError as e:
                attempts.append(failed_attempt(method, time.perf_counter() - t0, e.__cause__ or e))
                if e.graph is not None:
                    e.graph.attempts = attempts
                raise
            except fatal:
                raise
            except RejectedInputs as e:
                attempts.append(failed_attempt(method, time.perf_counter() - t0, e))
                with session.attempt():
                    checked = _model_runs(model, args, kwargs, attempts, validate)
                continue
            except Exception as e:  # every failure is recorded; the next method gets its turn
                attempts.append(failed_attempt(method, time.perf_counter() - t0, e))
                continue
            if not graph.ops:
                with session.attempt():
                    ran = count_ops(model, flatten_inputs(model, args, kwargs))
                if ran:
                    attempts.append(failed_attempt(method, time.perf_counter() - t0, CaptureError(
                        f"{method} captured no op while the model ran {ran} ATen ops: they run where this "
                        "method cannot see them (a TorchScript or C++ module?)")))
                    continue
            attempts.append(Attempt(method, True, time.perf_counter() - t0))
            graph.attempts = attempts
            return graph
    raise CaptureError(f"could not capture {type(model).__name__}: every method failed", attempts)


def _model_runs(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], attempts: list[Attempt], validate: bool,
) -> tuple[Graph, float]:
    """Trace the model eagerly on the inputs a symbolic graph did not run on: if the model raises
    too, its :class:`ModelError` (with the partial graph and ``attempts``) is the answer; else
    the eager graph and its time, for the chain's ``eager`` attempt."""
    t0 = time.perf_counter()
    try:
        graph = CAPTURERS["eager"](model, args, kwargs, None, validate)
    except ModelError as e:
        attempts.append(failed_attempt("eager", time.perf_counter() - t0, e.__cause__ or e))
        if e.graph is not None:
            e.graph.attempts = attempts
        raise
    return graph, time.perf_counter() - t0


def capture(
    model: nn.Module,
    args: Any = (),
    kwargs: dict[str, Any] | None = None,
    *,
    method: str = "auto",
    passes: Sequence[str] = CAPTURE_PASSES,
    dynamic_shapes: Any = None,
    validate: bool = True,
    isolate: bool | None = None,
    backward: bool = False,
    loss: Callable[[Any], torch.Tensor] | None = None,
    world_size: int | None = None,
) -> Graph:
    """Capture ``model``'s forward on example inputs as an annotated :class:`~fxviz.ir.Graph`.

    ``args``/``kwargs`` follow ``torch.export.export``: a tuple of positional inputs and a dict of
    keyword inputs (a single tensor is accepted as ``args``). ``method`` is ``"auto"`` (each of
    ``AUTO_CHAIN`` in turn, skipping those that cannot succeed after an earlier failure) or one
    method by name. Every attempt is recorded in ``graph.attempts``;
    :class:`~fxviz.errors.CaptureError` lists them all when none works. When the model itself
    raises on the inputs, :class:`~fxviz.errors.ModelError` reaches the caller with the annotated
    partial graph as ``err.graph``.

    A symbolic capture on real inputs is confirmed on them where the capture did not already prove
    it (``validate``): export runs its program, at the cost of one forward, only when it carries
    runtime assertions, sizes bound to tensor data, a ``torch.cond`` (to take its branch) or
    inputs that fake kernels accept and real ones may refuse (mixed dtypes, token ids past a
    table); fx runs the model. Inputs the model rejects are a ``ModelError``, never a graph called a
    success. ``validate=False`` skips that; inputs on ``meta`` or fake
    tensors are never run. Lazy modules (``nn.LazyLinear``) not initialised yet are initialised by one
    forward on a copy of the model, and the copy is captured (``graph.notes`` says so). A ``torch.compile``, ``DataParallel`` or ``DistributedDataParallel``
    wrapper is taken off (``graph.notes`` says so); a TorchScript module is refused.

    ``isolate`` runs the symbolic attempts in a forked child process, which gives back everything
    export keeps alive (about 1 MB per decoder layer, held inside torch): ``None`` (the default)
    does so for models of 1,024 modules or more, on Linux, before CUDA is initialised; the model
    and the process are the parent's either way.

    ``backward=True`` captures one training step, forward and backward (:mod:`fxviz.training`):
    ``loss(output) -> scalar tensor`` is what is differentiated, by default the sum of every floating
    tensor of the output. Backward ops have ``phase == "backward"`` and sit in the module call of
    the forward op they differentiate; parameters' gradients are outputs ``grad of <name>``;
    ``graph.saved`` lists the tensors autograd keeps for the backward. ``method`` is ``"auto"``
    (the joint graph through export, then the eager tracer), ``"export"`` or ``"eager"``. The
    model's parameters, ``.grad``, buffers and random state are left as they were.

    ``world_size=N`` captures a sharded model without a cluster: ``model`` may then be a factory
    (``() -> model`` or ``(model, args[, kwargs])``) that runs inside a fake process group of N ranks
    (:func:`fxviz.torchbridge.distributed.fake_world`; a group the caller made is used and left
    alone), and the collectives of the run are recorded (:class:`fxviz.fallback.comms.CommRecorder`,
    counted as torch's ``CommDebugMode`` counts them): ``graph.annotations["collectives"]``, the
    ``comm`` overlay, totals per mesh dimension (or process group) in the notes. With ``backward``
    the backward's collectives (FSDP2's gradient reduce-scatters, tensor parallel's gradient
    all-reduces) are backward nodes in the module of the backward op that ran them. On a real group,
    a collective that never returns ends in :class:`~fxviz.errors.CollectiveTimeout` (at the group's
    timeout) with the partial graph; ``graph.annotations["rank"]`` is this process's rank, for
    :func:`fxviz.passes.comm.rank_mismatches`. A model sharded in a group the caller made (a
    ``DTensor`` parameter) is recorded so without ``world_size``, at that group's size.
    """
    if world_size is None:
        world_size = _callers_world(model)
    if world_size is not None:
        return _capture_distributed(model, args, kwargs, world_size, method=method, passes=passes,
                                    validate=validate, backward=backward, loss=loss)
    return _capture_here(model, args, kwargs, method=method, passes=passes, dynamic_shapes=dynamic_shapes,
                         validate=validate, isolate=isolate, backward=backward, loss=loss)


def _capture_here(model: nn.Module, args: Any, kwargs: dict[str, Any] | None, *, method: str,
                  passes: Sequence[str], dynamic_shapes: Any = None, validate: bool, isolate: bool | None = None,
                  backward: bool, loss: Callable[[Any], torch.Tensor] | None) -> Graph:
    """:func:`capture` in this process, as it is (no process group made, no collectives recorded)."""
    if method not in METHODS:
        raise TargetError(f"method {method!r} is not one of {', '.join(METHODS)}")
    model, notes = unwrap(model)
    args, kwargs = normalize_args(model, args, kwargs)
    _refuse_scripted(model)
    with walks_shared():  # the walk that looks for lazy modules serves the capture too
        model, lazy = initialised(model, args, kwargs)  # a copy, when lazy modules wait for a first forward
        notes += lazy
        methods = AUTO_CHAIN if method == "auto" else (method,)
        capturers, fatal = (training_methods(method, loss), FATAL) if backward else ((CAPTURERS, methods), ())
        with interrupts_kept(), gc_paused():
            try:
                graph = run_methods(model, args, kwargs, methods=capturers[1], dynamic_shapes=dynamic_shapes,
                                    validate=validate, isolate=isolate, capturers=capturers[0], fatal=fatal)
            except ModelError as e:  # the model itself raised: annotate its partial graph all the same
                if e.graph is not None:
                    e.graph.notes = notes + e.graph.notes
                    run_passes(e.graph, passes)
                raise
            graph.notes = notes + graph.notes + ([] if backward else fast_path_notes(model, args, kwargs))
            if not backward:  # every method lists the model's whole state, as export does
                add_unread_state(graph, model)
            return run_passes(graph, passes)


def _callers_world(model: Any) -> int | None:
    """The size of the caller's own process group when ``model`` is sharded in it (a ``DTensor``
    parameter: tensor parallel, FSDP2), whose collectives are then recorded as with ``world_size``."""
    if "torch.distributed.tensor" not in sys.modules or not isinstance(model, nn.Module):
        return None  # nothing sharded can exist: torch.distributed not even read
    from torch.distributed.tensor import DTensor

    sharded = torch.distributed.is_initialized() and any(isinstance(p, DTensor) for p in model.parameters())
    return torch.distributed.get_world_size() if sharded else None


def _capture_distributed(model: Any, args: Any, kwargs: dict[str, Any] | None, world_size: int,
                         **options: Any) -> Graph:
    """:func:`capture` with ``world_size``: the factory and the capture run in a fake process group."""
    from fxviz.fallback.commfail import fake_cannot, sharded_hint, timed_out
    from fxviz.fallback.comms import CommRecorder, mesh_dims, unused_ranks
    from fxviz.fallback.modes import around_recordings
    from fxviz.passes.tree import sharing
    from fxviz.torchbridge.distributed import fake_world, fake_world_hint

    if options["method"] == "auto":  # export fails on DTensor: the eager tracer records the ops
        options["method"] = "eager"
    with fake_world(world_size):
        if not isinstance(model, nn.Module) and callable(model):
            try:
                made = model()
            except TargetError:
                raise
            except Exception as e:  # noqa: BLE001 - the factory is the user's code: one line
                raise TargetError(f"the factory failed under a fake process group of {world_size} ranks: "
                                  f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                                  f"{fake_world_hint(e)}") from e
            if isinstance(made, tuple):
                model, args, kwargs = (*made, None)[:3] if len(made) == 2 else made
            else:
                model = made
        # the tracer's forward is the only run of a forward-only eager capture: the recorder (a
        # dispatch mode, which every op pays for) is on for it alone; otherwise for the whole capture
        tracer_only = not options.get("backward") and options["method"] in ("eager", "eager-aten")
        # the parameters' names: whose gradient a hook handles, which a forward-only capture never
        # runs; one walk serves the recorder and the meshes
        params = dict(model.named_parameters()) if isinstance(model, nn.Module) and not tracer_only else None
        recorder = CommRecorder({id(p): n for n, p in params.items()} if params is not None else None)
        with sharing():  # the call tree the passes build serves the comm overlay after them
            try:
                with around_recordings(recorder) if tracer_only else recorder:
                    graph = _capture_here(model, args, kwargs, **options)
            except ModelError as e:  # the partial graph keeps the collectives recorded up to the failure
                hang = timed_out(e, recorder.records)
                fake = hang is None and torch.distributed.get_backend() == "fake"
                cannot = fake_cannot(e, recorder.records, fake) if hang is None else None
                if e.graph is not None:
                    e.graph.annotations["rank"] = torch.distributed.get_rank()
                    _write_comm(e.graph, recorder.records, mesh_dims(_state_and_inputs(model, args, kwargs, params),
                                                                     {r["group"] for r in recorder.records}))
                if hang is not None:
                    raise CollectiveTimeout(hang, graph=e.graph) from e.__cause__
                if cannot is not None:
                    raise ModelError(cannot, graph=e.graph) from e.__cause__
                uneven = sharded_hint(e, params.items() if params is not None else
                                       model.named_parameters() if isinstance(model, nn.Module) else ())
                if uneven:
                    raise ModelError(str(e) + uneven, graph=e.graph) from e.__cause__
                raise
            # inside: the meshes' groups still exist; only the groups the collectives used are named
            dims = mesh_dims(_state_and_inputs(model, args, kwargs, params), {r["group"] for r in recorder.records})
            unused = unused_ranks(_state_and_inputs(model, args, kwargs, params), world_size)
            graph.notes += [unused] if unused else []
            graph.annotations["rank"] = torch.distributed.get_rank()
            _write_comm(graph, recorder.records, dims)
    return graph


def _write_comm(graph: Graph, records: list[dict[str, Any]], dims: dict[str, str]) -> None:
    from fxviz.passes.comm import write_comm

    for r in records:
        r["mesh_dim"] = dims.get(r["group"], "")
    write_comm(graph, records)


def _state_and_inputs(model: Any, args: Any, kwargs: dict[str, Any] | None,
                      params: dict[str, Any] | None = None) -> Iterator[Any]:
    """The model's parameters (``params``: its ``named_parameters()``, when already taken) and
    buffers and the top-level inputs, walked lazily: where its DTensors' meshes are."""
    if isinstance(model, nn.Module):
        yield from params.values() if params is not None else model.parameters()
        yield from model.buffers()
    yield from args if isinstance(args, (tuple, list)) else (args,)
    yield from (kwargs or {}).values()


def compare(
    model: nn.Module,
    args: Any = (),
    kwargs: dict[str, Any] | None = None,
    *,
    decompose: bool = False,
    level: str | None = None,
    dynamic_shapes: Any = None,
    passes: Sequence[str] = CAPTURE_PASSES,
) -> Diff:
    """Capture ``model`` symbolically (``torch.export``) and eagerly (the tracer) on the same
    inputs, and :func:`~fxviz.graphdiff.diff` the two graphs: where export and eager PyTorch part ways.

    ``decompose=True`` compares export after ``run_decompositions()`` (core ATen). ``level`` is the
    eager tracer's level; by default the one that matches the symbolic side: ``"function"`` for
    export's training IR, whose ops (``aten.linear``, ``aten.layer_norm``) are the torch calls a
    user writes, and ``"aten"`` for the decomposed IR, which is what the dispatcher runs. Either way
    ops are folded to their torch-level call before they are aligned.

    When symbolic capture fails the comparison still runs: the symbolic side is an empty graph
    with the failed attempt, and the difference places the failure on the eager graph at the
    data-dependent node behind it. If the model itself raises, the eager side is the partial graph.

        >>> d = fxviz.compare(model, (x,))
        >>> d.summary(), bool(d.significant)
        ({'only_in_a': 1}, True)
    """
    level = level or ("aten" if decompose else "function")
    if level not in ("function", "aten"):
        raise TargetError(f"level {level!r} is not one of 'function', 'aten'")
    args, kwargs = normalize_args(model, args, kwargs)
    symbolic_method = "export-decomposed" if decompose else "export"
    eager_method = "eager" if level == "function" else "eager-aten"

    t0 = time.perf_counter()
    a = _capture_symbolic_for_compare(model, args, kwargs, symbolic_method, passes, dynamic_shapes)
    t1 = time.perf_counter()
    try:
        b = capture(model, args, kwargs, method=eager_method, passes=passes)
    except ModelError as e:
        if e.graph is None:
            raise
        b = e.graph
    t2 = time.perf_counter()
    result = diff(a, b, labels=(symbolic_method, eager_method))
    result.seconds.update(a=t1 - t0, b=t2 - t1)
    return result


def _capture_symbolic_for_compare(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], method: str,
    passes: Sequence[str], dynamic_shapes: Any,
) -> Graph:
    """The symbolic side of :func:`compare`. Without ``dynamic_shapes`` from the caller every input
    size is exported as ``Dim.AUTO``: with all sizes static, export specialises on shapes silently
    (a branch on ``x.shape[0]`` leaves no trace), while symbolic sizes turn each such decision into
    a guard fxviz reports with its source line. Sizes the code pins stay concrete. If export cannot
    handle symbolic sizes, static ones are tried, and both attempts are kept."""
    tries = [dynamic_shapes]
    if dynamic_shapes is None:
        tensors = flatten_inputs(model, args, kwargs).tensors
        tries = [[{i: Dim.AUTO for i in range(t.dim())} for t in tensors], None]
    attempts: list[Attempt] = []
    for k, ds in enumerate(tries):
        try:
            g = capture(model, args, kwargs, method=method, passes=passes, dynamic_shapes=ds)
        except CaptureError as e:
            # tell the symbolic-size try from the static one in the attempt list
            attempts += [dataclasses.replace(x, method=f"{x.method} (symbolic sizes)") if k == 0 and len(tries) > 1
                         else x for x in e.attempts]
            continue
        g.attempts = attempts + g.attempts
        return g
    return Graph(name=type(model).__name__, attempts=attempts, modules=module_infos(model))
