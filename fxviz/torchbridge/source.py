"""Where in the user's code: frames, stack traces and exceptions -> :class:`~fxviz.ir.SourceLoc`."""

from __future__ import annotations

import os
import re
import sysconfig
import traceback
from functools import lru_cache

import torch
import typing_extensions

from fxviz.ir import SourceLoc

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_FXVIZ_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# fxviz's own machinery is never "user code"; its built-in examples are
_FXVIZ_EXAMPLES = os.path.join(_FXVIZ_PKG, "examples.py")
#: wrappers between the user's call and torch's function, never where the user wrote it: the
#: standard library's (``functools``, ``contextlib``, ``copy``; not its site-packages) and
#: ``typing_extensions.deprecated``'s (around ``dist.all_gather_into_tensor``)
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
_WRAPPER_FILES = frozenset({os.path.abspath(typing_extensions.__file__)})
FRAME_RE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)\n(?P<code>[^\n]*)')


def is_fxviz_file(path: str) -> bool:
    """fxviz's own code (its modes, recorder and hooks; not its built-in examples): a stack quoted
    outermost first holds, before it, only fxviz's callers (the CLI, click, a test runner), never
    the model's frames."""
    return path.startswith(_FXVIZ_PKG) and path != _FXVIZ_EXAMPLES


def is_user_file(path: str) -> bool:
    """True for code a user would want to be pointed at: not torch's internals, not fxviz's."""
    if path.startswith(_FXVIZ_PKG):
        return path == _FXVIZ_EXAMPLES
    if path.startswith(_STDLIB) and "-packages" not in path:
        return False
    return not (path.startswith(_TORCH_DIR) or path.startswith("<") or path in _WRAPPER_FILES)


@lru_cache(maxsize=4096)
def source_from_trace(stack_trace: str | None) -> SourceLoc | None:
    """The innermost user frame of an fx ``stack_trace`` string."""
    if not stack_trace:
        return None
    best = None
    for m in FRAME_RE.finditer(stack_trace):
        if is_user_file(m["file"]):
            best = m
        elif is_fxviz_file(m["file"]):  # what came before called fxviz: not the model's line
            best = None
    if best is None:
        return None
    return SourceLoc(best["file"], int(best["line"]), best["func"], best["code"].strip())


def error_location(exc: BaseException) -> SourceLoc | None:
    """The innermost user frame behind an exception: from the frames the message quotes (Dynamo
    and export print the user stack), else from the traceback itself."""
    best = None
    for m in FRAME_RE.finditer(str(exc)):
        if is_user_file(m["file"]):
            best = SourceLoc(m["file"], int(m["line"]), m["func"], m["code"].strip())
        elif is_fxviz_file(m["file"]):  # fx quotes the whole stack at trace time: its callers first
            best = None
    if best is not None:
        return best
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename and is_fxviz_file(frame.filename):
            break  # what is above fxviz called it
        if frame.filename and is_user_file(frame.filename) and frame.lineno is not None:
            return SourceLoc(frame.filename, frame.lineno, frame.name, (frame.line or "").strip())
    return None
