"""One error hierarchy: every message says what failed, where, and what to do.

Every public function raises from :class:`FxvizError`; a subclass also derives from ``ValueError``
or ``TypeError`` where that is what a caller would catch. Each class carries the exit code the CLI
gives it (``fxviz`` prints ``str(error)`` as one line and exits with ``exit_code``; ``--verbose``
adds the traceback):

==========================  ====  ==========================================================
error                       exit  when
==========================  ====  ==========================================================
:class:`ModelError`         1     the model itself raised (the partial graph is kept)
:class:`CollectiveTimeout`  1     a collective never returned (the partial graph is kept)
:class:`CaptureError`       3     no capture method produced a graph
:class:`PassError`          4     a pass failed
:class:`RenderError`        5     a renderer could not write its output
:class:`TargetError`        2     the target, its inputs or an option is unusable
:class:`GraphFormatError`   2     a saved graph (JSON) is malformed
==========================  ====  ==========================================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fxviz.ir import Attempt, Graph


class FxvizError(Exception):
    """Base class of every error fxviz raises on purpose."""

    exit_code = 1


class CaptureError(FxvizError):
    """No capture method produced a graph. ``attempts`` holds each method's reason; the message is
    one line, the attempts are listed by :meth:`details`."""

    exit_code = 3

    def __init__(self, message: str, attempts: list[Attempt] | None = None) -> None:
        self.attempts = list(attempts or [])
        if self.attempts:
            reasons = "; ".join(f"{a.method}: {a.reason()}" for a in self.attempts)
            message = f"{message} ({reasons})"
        super().__init__(message)

    def details(self) -> list[str]:
        return [f"{a.method}: {a.reason()}" for a in self.attempts]


class ModelError(FxvizError):
    """The model itself raised during capture. ``graph`` is the partial graph up to the failure,
    with the failing node marked; the original exception is the ``__cause__``."""

    exit_code = 1

    def __init__(self, message: str, graph: Graph | None = None) -> None:
        super().__init__(message)
        self.graph = graph


class CollectiveTimeout(ModelError):
    """A collective never returned: the process group's timeout ran out while this rank waited for
    the others (one that never issues it, or issues another one first: the classic hang). ``graph``
    is the partial graph with the collectives recorded up to it, the one that hung marked."""


class PassError(FxvizError):
    """A pass failed; the message names it and the passes that ran before it."""

    exit_code = 4


class RenderError(FxvizError):
    """A renderer could not produce its output (a missing optional dependency, an unwritable path)."""

    exit_code = 5


class TargetError(FxvizError, ValueError):
    """The CLI target (``file.py:factory``, ``package.module:factory``, a saved graph, a ``.pt2``
    file), its inputs, or an argument of a public function is unusable."""

    exit_code = 2


class InputError(TargetError, TypeError):
    """An argument of a public function has the wrong type (not an ``nn.Module``, kwargs not a dict)."""


class GraphFormatError(FxvizError, ValueError):
    """A saved graph is malformed: the message names the field or node and what was expected."""

    exit_code = 2


class ReplayError(FxvizError):
    """The graph cannot be replayed (randomness, a partial graph) or an op failed when replayed."""


__all__ = [
    "CaptureError", "CollectiveTimeout", "FxvizError", "GraphFormatError", "InputError", "ModelError", "PassError",
    "RenderError", "ReplayError", "TargetError",
]
