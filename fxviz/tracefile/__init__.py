"""Read torch's structured trace (``TORCH_TRACE=DIR``, or the live records of a run) without torch.

One reader serves a saved directory and a live run alike: ``read_trace(path_or_lines)`` returns a
:class:`Trace` (see :mod:`fxviz.tracefile.records`).
"""

from __future__ import annotations

from fxviz.tracefile.records import Artifact, Compile, Phase, Problem, Trace

__all__ = ["Artifact", "Compile", "Phase", "Problem", "Trace"]
