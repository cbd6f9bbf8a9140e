"""Fallback: the eager runtime tracer, for models symbolic capture cannot follow.

:func:`trace_eager` runs the model once and records what it executes (torch-function calls or ATen
ops, the module calls around them, the tensors flowing between them) as the same
:class:`~fxviz.ir.Graph` export produces; :func:`replay` runs such a graph again, as the check that
the trace is faithful. ``fxviz.capture(method="auto")`` ends with it: ``method="eager"``.
"""

from __future__ import annotations

from fxviz.fallback.replay import ReplayError, replay
from fxviz.fallback.tracer import trace_eager, uses_meta

__all__ = ["ReplayError", "replay", "trace_eager", "uses_meta"]
