"""Writing rendered files: one place that turns an unwritable path into a clear error."""

from __future__ import annotations

import os
from pathlib import Path

from fxviz.errors import RenderError


def write_text(path: str | os.PathLike[str], text: str, *, what: str) -> None:
    """Write a rendered file; an unwritable path is a :class:`RenderError` that names it."""
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as e:
        raise RenderError(
            f"cannot write the {what} to {os.fspath(path)!r} ({e.strerror or e}): check that the path is writable"
        ) from e
