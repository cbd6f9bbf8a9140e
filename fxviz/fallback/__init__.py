"""Fallback: the eager runtime tracer, for models symbolic capture cannot follow.

:func:`trace_eager` runs the model once and records what it executes (torch-function calls or ATen
ops, the module calls around them, the tensors flowing between them) as the same
:class:`~fxviz.ir.Graph` export produces; :func:`replay` runs such a graph again, as the check that
the trace is faithful. ``fxviz.capture(method="auto")`` ends with it: ``method="eager"``.

The way through, in reading order:

- ``trace.py``: :func:`trace_eager`: set-up, the run, outputs, restoring the model, partial graphs;
- ``modes.py``: what feeds the recorder: a torch mode at either level, and module hooks;
- ``recorder.py``: :class:`Recorder`, one call in, one node out; ``observe.py``: its hot path;
- ``classify.py``: what a callable is (an op, a metadata query, an exit from the graph);
- ``tensors.py``: tensor identity and versions, the model's own tensors by name;
- ``context.py``: where a call happens: module stack, user source line, node names;
- ``values.py``: non-tensor arguments as attrs; ``replay.py``: the graph run again.

Torch objects stop here, as in ``torchbridge``: tensors become :class:`~fxviz.ir.TensorMeta`, frames
become :class:`~fxviz.ir.SourceLoc`, arguments become JSON-safe attrs.
"""

from __future__ import annotations

from fxviz.errors import ReplayError
from fxviz.fallback.replay import replay
from fxviz.fallback.trace import trace_eager, uses_meta

__all__ = ["ReplayError", "replay", "trace_eager", "uses_meta"]
