"""The public entry points: :func:`capture` and :func:`compare`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torch import nn

from fxviz.capture import AUTO_CHAIN, CAPTURERS, capture_symbolic, normalize_args
from fxviz.capture.convert import gc_paused
from fxviz.errors import CaptureError, ModelError
from fxviz.ir import Graph
from fxviz.passes import DEFAULT, run_passes

if TYPE_CHECKING:
    from fxviz.graphdiff import Diff

METHODS: tuple[str, ...] = ("auto", *CAPTURERS)


def capture(
    model: nn.Module,
    args: Any = (),
    kwargs: dict[str, Any] | None = None,
    *,
    method: str = "auto",
    passes: Sequence[str] = DEFAULT,
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
        raise ValueError(f"method {method!r} is not one of {', '.join(METHODS)}")
    args, kwargs = normalize_args(model, args, kwargs)
    methods = AUTO_CHAIN if method == "auto" else (method,)
    with gc_paused():
        try:
            graph = capture_symbolic(model, args, kwargs, methods=methods, dynamic_shapes=dynamic_shapes)
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
    passes: Sequence[str] = DEFAULT,
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
    from fxviz.capture.convert import module_infos
    from fxviz.graphdiff import diff

    level = level or ("aten" if decompose else "function")
    if level not in ("function", "aten"):
        raise ValueError(f"level {level!r} is not one of 'function', 'aten'")
    args, kwargs = normalize_args(model, args, kwargs)
    symbolic_method = "export-decomposed" if decompose else "export"
    eager_method = "eager" if level == "function" else "eager-aten"

    t0 = time.perf_counter()
    try:
        a = capture(model, args, kwargs, method=symbolic_method, passes=passes, dynamic_shapes=dynamic_shapes)
    except CaptureError as e:
        a = Graph(name=type(model).__name__, attempts=e.attempts, modules=module_infos(model))
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
