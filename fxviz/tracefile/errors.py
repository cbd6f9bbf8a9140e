"""The one error the trace reader raises: a trace that cannot be read at all (no torch)."""

from __future__ import annotations

from fxviz.errors import GraphFormatError


class TraceFileError(GraphFormatError):
    """A structured trace (``TORCH_TRACE=DIR``) cannot be read: the path is missing, holds no trace
    lines at all, or a payload (a graph, output code) is malformed. The message names the file and
    line and says what to do; the CLI prints it as one line (exit code 2)."""


__all__ = ["TraceFileError"]
