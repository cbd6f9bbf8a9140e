"""fxviz shows what a PyTorch model really computes in its forward pass.

The way through the house: ``capture/`` turns a model and example inputs into an
:class:`~fxviz.ir.Graph` (torch.export, then torch.fx, then the eager tracer in ``fallback/``);
``passes/`` annotate the graph (module paths, shapes, statistics, folded repeats); ``render/``
draws it (rich tree, HTML report, Graphviz); ``graphdiff`` aligns two graphs (symbolic against eager,
or any two) and classifies where they differ; ``cli`` is a thin shell over this API.

    >>> import fxviz, torch
    >>> g = fxviz.capture(model, (torch.randn(1, 3, 32, 32),))
    >>> g.method, len(g.ops)
    ('export', 15)
    >>> print(g)            # the module tree, ops in execution order, shapes, parameter counts
"""

from __future__ import annotations

from fxviz.api import capture, compare
from fxviz.errors import CaptureError, FxvizError, ModelError, PassError, RenderError, TargetError
from fxviz.graphdiff import Diff, Difference, diff
from fxviz.ir import Attempt, Edge, Graph, ModuleInfo, Node, Ref, Scope, SourceLoc, TensorMeta
from fxviz.passes import DEFAULT as DEFAULT_PASSES
from fxviz.passes import run_passes

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_PASSES",
    "Attempt",
    "CaptureError",
    "Edge",
    "FxvizError",
    "Graph",
    "ModelError",
    "ModuleInfo",
    "Node",
    "PassError",
    "Ref",
    "RenderError",
    "Scope",
    "SourceLoc",
    "TargetError",
    "TensorMeta",
    "Diff",
    "Difference",
    "capture",
    "compare",
    "diff",
    "run_passes",
]
