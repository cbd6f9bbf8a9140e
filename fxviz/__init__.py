"""fxviz shows what a PyTorch model really computes in its forward pass.

The way through the house, bottom to top:

* ``ir`` (with ``calls``, the module call tree, and ``ops``, op names and families): the graph as
  plain data. No torch anywhere below ``torchbridge``, so a saved graph renders without torch.
* ``passes/`` annotate a graph (module paths, shapes, statistics, folded repeats, structure);
  ``graphdiff/`` aligns two graphs and classifies where they differ; ``render/`` draws graphs and
  diffs (rich tree, HTML report, Graphviz).
* ``torchbridge/`` turns torch values into IR; ``capture/`` (torch.export, torch.fx) and
  ``fallback/`` (the eager tracer) build graphs on it.
* ``api`` chooses and chains capture methods; ``cli`` is a thin shell over it.

    >>> import fxviz, torch
    >>> g = fxviz.capture(model, (torch.randn(1, 3, 32, 32),))
    >>> g.method, len(g.ops)
    ('export', 15)
    >>> print(g)            # the module tree, ops in execution order, shapes, parameter counts

``import fxviz`` does not import torch: the names that capture (``capture``, ``compare``) import it
on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# torch-free and cheap: importing render registers the renderers Graph and Diff draw themselves with
import fxviz.render as _render  # noqa: F401
from fxviz.errors import (
    CaptureError,
    FxvizError,
    GraphFormatError,
    InputError,
    ModelError,
    PassError,
    RenderError,
    ReplayError,
    TargetError,
)
from fxviz.ir import Attempt, Edge, Graph, ModuleInfo, Node, Ref, Scope, SourceLoc, TensorMeta
from fxviz.passes import DEFAULT as DEFAULT_PASSES
from fxviz.passes import run_passes

if TYPE_CHECKING:  # imported on first use (see _LAZY); type checkers see them as they are
    from fxviz.analyze.compilemap import CompileMap, compile_map
    from fxviz.analyze.numerics import Numerics, numerics
    from fxviz.analyze.pipeline import Pipeline, pipeline
    from fxviz.graphdiff import Diff, Difference, diff

#: Public names imported from their module on first use: those that need torch, and those that
#: cost start-up time a command like ``fxviz tree g.json`` does not need (the comparison, the
#: package metadata behind ``__version__``).
_LAZY = {
    "capture": "fxviz.api", "compare": "fxviz.api", "METHODS": "fxviz.api",
    "compile_map": "fxviz.analyze.compilemap", "CompileMap": "fxviz.analyze.compilemap",
    "Diff": "fxviz.graphdiff", "Difference": "fxviz.graphdiff", "diff": "fxviz.graphdiff",
    "numerics": "fxviz.analyze.numerics", "Numerics": "fxviz.analyze.numerics",
    "pipeline": "fxviz.analyze.pipeline", "Pipeline": "fxviz.analyze.pipeline",
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fxviz")
    except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value: Any = _version()
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module 'fxviz' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY, "__version__"])


__all__ = [
    "DEFAULT_PASSES",
    "METHODS",
    "Attempt",
    "CaptureError",
    "CompileMap",
    "Diff",
    "Difference",
    "Edge",
    "FxvizError",
    "Graph",
    "GraphFormatError",
    "InputError",
    "ModelError",
    "ModuleInfo",
    "Node",
    "Numerics",
    "PassError",
    "Pipeline",
    "Ref",
    "RenderError",
    "ReplayError",
    "Scope",
    "SourceLoc",
    "TargetError",
    "TensorMeta",
    "capture",
    "compare",
    "compile_map",
    "diff",
    "numerics",
    "pipeline",
    "run_passes",
]
