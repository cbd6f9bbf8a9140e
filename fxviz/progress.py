"""Stages of an analysis that takes seconds to minutes (a capture trying methods, a compile map
compiling graph after graph), told to whoever listens: the CLI's progress line. Torch-free.

    >>> with listening(seen.append):
    ...     stage("compiling graph g0")
    >>> seen
    ['compiling graph g0']

Nothing happens when no one listens (the Python API, a pipe, CI logs)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

_LISTENER: ContextVar[Callable[[str], None] | None] = ContextVar("fxviz_progress", default=None)

__all__ = ["listening", "stage"]


def stage(text: str) -> None:
    """Say that the analysis has reached ``text`` (one short line, present tense)."""
    listener = _LISTENER.get()
    if listener is not None:
        listener(text)


@contextlib.contextmanager
def listening(listener: Callable[[str], None]) -> Iterator[None]:
    """Send every :func:`stage` said inside the block to ``listener``."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)
