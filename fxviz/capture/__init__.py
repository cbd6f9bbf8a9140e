"""Capture: model + example inputs -> :class:`fxviz.ir.Graph`.

``capture(method="auto")`` tries each method of :data:`AUTO_CHAIN` in turn and keeps the first
graph; every attempt, with its outcome and reason, is recorded on the graph.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch import nn

from fxviz.capture.convert import _FRAME_RE, is_user_file
from fxviz.capture.symbolic import capture_export, capture_fx
from fxviz.errors import CaptureError, ModelError
from fxviz.ir import Attempt, Graph, SourceLoc

Capturer = Callable[[nn.Module, tuple[Any, ...], dict[str, Any], Any], Graph]


def _eager(level: str) -> Capturer:
    """The eager tracer as a capturer; fake tensors whenever the model or an input is on ``meta``.
    Imported on use: ``fallback`` builds on this package's converters."""

    def run(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], _ds: Any) -> Graph:
        from fxviz.fallback import trace_eager, uses_meta

        return trace_eager(model, args, kwargs, level=level, fake=uses_meta(model, args, kwargs))

    return run


CAPTURERS: dict[str, Capturer] = {
    "export": lambda m, a, k, ds: capture_export(m, a, k, strict=False, dynamic_shapes=ds),
    "export-strict": lambda m, a, k, ds: capture_export(m, a, k, strict=True, dynamic_shapes=ds),
    "export-decomposed": lambda m, a, k, ds: capture_export(m, a, k, dynamic_shapes=ds, decompose=True),
    "fx": lambda m, a, k, ds: capture_fx(m, a, k),
    "eager": _eager("function"),
    "eager-aten": _eager("aten"),
}

#: What ``method="auto"`` tries, in order.
AUTO_CHAIN: tuple[str, ...] = ("export", "export-strict", "fx", "eager")

_MAX_MESSAGE = 4000
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def normalize_args(model: Any, args: Any, kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Check the model and inputs; a single tensor or a list of inputs is accepted as ``args``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"fxviz captures torch.nn.Module instances, got {type(model).__name__}")
    if args is None:
        args = ()
    elif not isinstance(args, tuple):
        args = tuple(args) if isinstance(args, list) else (args,)
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict of keyword inputs, got {type(kwargs).__name__}")
    return args, kwargs


def error_location(exc: BaseException) -> SourceLoc | None:
    """The innermost user frame behind an exception: from the frames the message quotes (Dynamo
    and export print the user stack), else from the traceback itself."""
    best = None
    for m in _FRAME_RE.finditer(str(exc)):
        if is_user_file(m["file"]):
            best = SourceLoc(m["file"], int(m["line"]), m["func"], m["code"].strip())
    if best is not None:
        return best
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename and is_user_file(frame.filename) and frame.lineno is not None:
            return SourceLoc(frame.filename, frame.lineno, frame.name, (frame.line or "").strip())
    return None


def failed_attempt(method: str, seconds: float, exc: BaseException) -> Attempt:
    message = _ANSI.sub("", str(exc)).strip()
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + " ..."
    return Attempt(method, False, seconds, type(exc).__name__, message, error_location(exc))


@contextlib.contextmanager
def quiet_torch() -> Iterator[None]:
    """Silence torch's own error reports (export, Dynamo, fake tensors) while we try methods: a
    failed attempt is reported once, by us, in ``graph.attempts``. A logger without a level of
    its own inherits its parent's, so raising ``torch`` and the few ``torch.*`` loggers that torch
    gave a level of their own silences them all (each ``setLevel`` clears every logger's cache, so
    doing it for all ~100 torch loggers cost a millisecond per capture); levels are restored
    afterwards. Export also prints a data-dependent error's partial graph straight to stderr (the
    exception carries it too), so stderr is held for the attempt."""
    registry = logging.Logger.manager.loggerDict
    loggers = [logging.getLogger("torch")] + [
        lg for n, lg in registry.items()
        if n.startswith("torch.") and isinstance(lg, logging.Logger) and lg.level != logging.NOTSET
    ]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def capture_symbolic(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    methods: Sequence[str],
    dynamic_shapes: Any = None,
) -> Graph:
    """Try ``methods`` in order; the first graph wins. Raises :class:`CaptureError` listing every
    attempt when none works, or the :class:`ModelError` of a method that ran the model and saw the
    model itself raise (its partial graph records the attempts)."""
    attempts: list[Attempt] = []
    for method in methods:
        t0 = time.perf_counter()
        try:
            with quiet_torch():
                graph = CAPTURERS[method](model, args, kwargs, dynamic_shapes)
        except ModelError as e:
            attempts.append(failed_attempt(method, time.perf_counter() - t0, e.__cause__ or e))
            if e.graph is not None:
                e.graph.attempts = attempts
            raise
        except Exception as e:  # every failure is recorded; the next method gets its turn
            attempts.append(failed_attempt(method, time.perf_counter() - t0, e))
            continue
        attempts.append(Attempt(method, True, time.perf_counter() - t0))
        graph.attempts = attempts
        return graph
    raise CaptureError(f"could not capture {type(model).__name__}: every method failed", attempts)


__all__ = ["AUTO_CHAIN", "CAPTURERS", "capture_symbolic", "error_location", "normalize_args"]
