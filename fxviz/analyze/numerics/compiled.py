"""The ``compile[:backend]`` side: the model under ``torch.compile`` against eager, per graph
output. A compiled graph runs as one opaque call (Inductor fuses ops into kernels whose internals
never exist as tensors), so only the values it hands back are compared; they are placed on the
eager ops that produce the model's outputs."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fxviz.analyze.numerics.metrics import compare
from fxviz.analyze.numerics.result import Error
from fxviz.analyze.numerics.run import Watcher, run_eager
from fxviz.ir import Graph
from fxviz.torchbridge.normalize import flatten_outputs


def compiled_errors(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *, backend: str,
                    rtol: float, atol: float, seed: int | None) -> tuple[Graph, dict[str, list[Error]], str]:
    """The eager graph, the errors of the compiled model's outputs (eager node name -> one per
    output of that node), and the note that says what was not observable. The compiled wrapper is
    made here and dropped after; Dynamo's caches are not reset (that would drop the user's other
    compiled models)."""
    graph, out = run_eager(model, args, kwargs, Watcher(), seed=seed)
    compiled = torch.compile(model, backend=backend)
    if seed is not None:
        torch.manual_seed(seed)
    with torch.no_grad():
        other = compiled(*args, **kwargs)
    eager_leaves = [v for _, v in flatten_outputs(out)]
    other_leaves = [v for _, v in flatten_outputs(other)]
    outputs = [n for n in graph.nodes if n.kind == "output"]
    errors: dict[str, list[Error]] = {}
    for node, a, b in zip(outputs, eager_leaves, other_leaves, strict=False):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or not node.inputs:
            continue
        ref = node.inputs[0]
        errs = errors.setdefault(ref.node, [])
        while len(errs) <= ref.index:
            errs.append(Error(comparable=False, note="not an output of the model"))
        errs[ref.index] = compare(a, b, rtol, atol)
    note = (f"compile:{backend} is compared per model output only: the compiled graphs run as opaque "
            "calls (fused kernels have no intermediate values)")
    return graph, errors, note


__all__ = ["compiled_errors"]
