"""The public entry point: :func:`capture`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from fxviz.capture import AUTO_CHAIN, CAPTURERS, capture_symbolic, normalize_args
from fxviz.errors import ModelError
from fxviz.ir import Graph
from fxviz.passes import DEFAULT, run_passes

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
    try:
        graph = capture_symbolic(model, args, kwargs, methods=methods, dynamic_shapes=dynamic_shapes)
    except ModelError as e:  # the model itself raised: annotate its partial graph all the same
        if e.graph is not None:
            run_passes(e.graph, passes)
        raise
    return run_passes(graph, passes)
