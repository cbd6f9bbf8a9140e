"""Renderers: pure functions of the IR (and what passes put on it).

``tree`` (rich terminal tree), ``html`` (self-contained interactive report, notebooks), ``dot``
(Graphviz DOT/SVG/PNG/PDF). ``view`` holds what they share: labels, op kinds, colours, module boxes.
"""

from __future__ import annotations

import os
from pathlib import Path

from fxviz.errors import RenderError


def write_text(path: str | os.PathLike[str], text: str, *, what: str) -> None:
    """Write a rendered file; an unwritable path is a :class:`RenderError` that names it."""
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as e:
        raise RenderError(f"cannot write the {what} to {os.fspath(path)!r} ({e}): check that the path is writable") from e
