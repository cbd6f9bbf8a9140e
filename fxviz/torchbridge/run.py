"""What running a capture attempt needs around it: checked arguments, a paused collector, torch's
own error reports held back, and a failure turned into an :class:`~fxviz.ir.Attempt`."""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import re
from collections.abc import Iterator
from typing import Any

from torch import nn

from fxviz.errors import InputError
from fxviz.ir import Attempt
from fxviz.torchbridge.source import error_location

_MAX_MESSAGE = 4000
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def normalize_args(model: Any, args: Any, kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Check the model and inputs; a single tensor or a list of inputs is accepted as ``args``."""
    if not isinstance(model, nn.Module):
        raise InputError(f"fxviz captures torch.nn.Module instances, got {type(model).__name__}")
    if args is None:
        args = ()
    elif not isinstance(args, tuple):
        args = tuple(args) if isinstance(args, list) else (args,)
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise InputError(f"kwargs must be a dict of keyword inputs, got {type(kwargs).__name__}")
    return args, kwargs


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a capture builds its graph: a capture allocates a
    few small objects per op and per node, which keeps triggering full collections over every
    object the process holds (torch and transformers hold millions; up to half the cost of tracing
    a deep model). Reference counting still frees everything; the collector resumes afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


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
