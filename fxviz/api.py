"""The public entry points: :func:`capture` and :func:`compare`. This is where capture methods are
chosen and chained: ``capture`` (symbolic) and ``fallback`` (eager) are siblings that each produce
a graph; the auto chain tries them in turn and records every attempt."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn
from torch.export import Dim

from fxviz.analyze.flops import CAPTURE_PASSES  # the default passes and flops (registers the pass)
from fxviz.errors import CaptureError, ModelError, TargetError
from fxviz.fallback.trace import trace_eager, uses_meta
from fxviz.graphdiff import Diff, diff
from fxviz.ir import Attempt, Graph
from fxviz.passes import run_passes
from fxviz.symbolic.export import capture_export
from fxviz.symbolic.fx import capture_fx
from fxviz.torchbridge.normalize import flatten_inputs
from fxviz.torchbridge.run import capture_session, failed_attempt, gc_paused, interrupts_kept, normalize_args
from fxviz.torchbridge.values import module_infos

Capturer = Callable[[nn.Module, tuple[Any, ...], dict[str, Any], Any], Graph]


def _eager(level: str) -> Capturer:
    """The eager tracer as a capturer; fake tensors whenever the model or an input is on ``meta``."""

    def run(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], _ds: Any) -> Graph:
        return trace_eager(model, args, kwargs, level=level, fake=uses_meta(model, args, kwargs))

    return run


#: Every capture method by name.
CAPTURERS: dict[str, Capturer] = {
    "export": lambda m, a, k, ds: capture_export(m, a, k, strict=False, dynamic_shapes=ds),
    "export-strict": lambda m, a, k, ds: capture_export(m, a, k, strict=True, dynamic_shapes=ds),
    "export-decomposed": lambda m, a, k, ds: capture_export(m, a, k, dynamic_shapes=ds, decompose=True),
    "fx": lambda m, a, k, ds: capture_fx(m, a, k),
    "eager": _eager("function"),
    "eager-aten": _eager("aten"),
}

#: What ``method="auto"`` tries, in order.
AUTO_CHAIN: tuple[str, ...] = ("export", "export-strict", "fx", "eager")

#: Every value ``capture(method=...)`` takes (the CLI's ``--method`` choices come from here).
METHODS: tuple[str, ...] = ("auto", *CAPTURERS)


def run_methods(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    methods: Sequence[str],
    dynamic_shapes: Any = None,
) -> Graph:
    """Try ``methods`` in order; the first graph wins. Raises :class:`CaptureError` listing every
    attempt when none works, or the :class:`ModelError` of a method that ran the model and saw the
    model itself raise (its partial graph records the attempts)."""
    attempts: list[Attempt] = []
    # one snapshot before the first attempt, restored after each (model, inputs, process)
    with capture_session(model, args, kwargs) as session:
        for method in methods:
            t0 = time.perf_counter()
            try:
                with session.attempt():
                    graph = CAPTURERS[method](model, args, kwargs, dynamic_shapes)
            except ModelError as e:
                attempts.append(failed_attempt(method, time.perf_counter() - t0, e.__cause__ or e))
                if e.graph is not None:
                    e.graph.attempts = attempts
                raise
            except Exception as e:  # every failure is recorded; the next method gets its turn
                attempts.append(failed_attempt(method, time.perf_counter() - t0, e))
                continue
            attempts.append(Attempt(method, True, time.perf_counter() - t0))
            graph.attempts = attempts
            return graph
    raise CaptureError(f"could not capture {type(model).__name__}: every method failed", attempts)


def capture(
    model: nn.Module,
    args: Any = (),
    kwargs: dict[str, Any] | None = None,
    *,
    method: str = "auto",
    passes: Sequence[str] = CAPTURE_PASSES,
    dynamic_shapes: Any = None,
) -> Graph:
    """Capture ``model``'s forward on example inputs as an annotated :class:`~fxviz.ir.Graph`.

    ``args``/``kwargs`` follow ``torch.export.export``: a tuple of positional inputs and a dict of
    keyword inputs (a single tensor is accepted as ``args``). ``method`` is ``"auto"`` (each of
    ``AUTO_CHAIN`` in turn) or one method by name. Every attempt is recorded in ``graph.attempts``;
    :class:`~fxviz.errors.CaptureError` lists them all when none works. When the model itself
    raises under the eager tracer, :class:`~fxviz.errors.ModelError` reaches the caller with the
    annotated partial graph as ``err.graph``.
    """
    if method not in METHODS:
        raise TargetError(f"method {method!r} is not one of {', '.join(METHODS)}")
    args, kwargs = normalize_args(model, args, kwargs)
    methods = AUTO_CHAIN if method == "auto" else (method,)
    with interrupts_kept(), gc_paused():
        try:
            graph = run_methods(model, args, kwargs, methods=methods, dynamic_shapes=dynamic_shapes)
        except ModelError as e:  # the model itself raised: annotate its partial graph all the same
            if e.graph is not None:
                run_passes(e.graph, passes)
            raise
        return run_passes(graph, passes)


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
