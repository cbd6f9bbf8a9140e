"""Read torch's structured trace (``TORCH_TRACE=DIR``, or the live records of a run) without torch.

One reader serves a saved directory and a live run alike: :func:`read_trace` (a directory or a file)
and :func:`read_events` (the ``(header, payload)`` events of
:func:`fxviz.torchbridge.tracelog.structured_trace`) return a :class:`Trace` (see
:mod:`fxviz.tracefile.records`) through one grouping path. A trace that cannot be read at all raises
:class:`TraceFileError`; anything less is a :class:`Problem` in ``Trace.problems``.
"""

from __future__ import annotations

from fxviz.tracefile.errors import TraceFileError
from fxviz.tracefile.reader import read_events, read_trace
from fxviz.tracefile.records import Artifact, Compile, Phase, Problem, Trace

__all__ = ["Artifact", "Compile", "Phase", "Problem", "Trace", "TraceFileError", "read_events",
           "read_trace"]
