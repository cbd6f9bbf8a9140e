"""One error hierarchy: every message says what failed, where, and what to do.

The CLI prints ``str(error)`` as one line and exits non-zero; ``--verbose`` adds the traceback.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fxviz.ir import Attempt, Graph


class FxvizError(Exception):
    """Base class of every error fxviz raises on purpose."""

    exit_code = 1


class CaptureError(FxvizError):
    """No capture method produced a graph. ``attempts`` holds each method's reason."""

    def __init__(self, message: str, attempts: list[Attempt] | None = None) -> None:
        self.attempts = list(attempts or [])
        if self.attempts:
            lines = "\n".join(f"  - {a.method}: {a.reason()}" for a in self.attempts)
            message = f"{message}\n{lines}"
        super().__init__(message)


class ModelError(FxvizError):
    """The model itself raised during capture. ``graph`` is the partial graph up to the failure,
    with the failing node marked; the original exception is the ``__cause__``."""

    def __init__(self, message: str, graph: Graph | None = None) -> None:
        super().__init__(message)
        self.graph = graph


class PassError(FxvizError):
    """A pass failed; the message names it and the passes that ran before it."""


class RenderError(FxvizError):
    """A renderer could not produce its output (a missing optional dependency, an unwritable path)."""


class TargetError(FxvizError):
    """The CLI target (``file.py:factory``, ``package.module:factory``) or its inputs are unusable."""

    exit_code = 2
