"""What running a capture needs around it: checked arguments, one capture at a time, Ctrl-C that
always ends it, the model and the process put back after every attempt (:mod:`fxviz.torchbridge.guard`),
torch's own noise held back while the model's own output reaches the user, a paused collector, and
a failure turned into an :class:`~fxviz.ir.Attempt`.

    >>> with capture_session(model, args, kwargs) as session:
    ...     for method in methods:
    ...         with session.attempt():
    ...             graph = capture_one(method)
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import inspect
import logging
import os
import re
import signal
import sys
import threading
import time
import types
import warnings
from collections.abc import Iterator
from typing import Any, TextIO

import torch
from torch import nn

from fxviz.errors import InputError
from fxviz.ir import Attempt
from fxviz.torchbridge.apart import ATTEMPT_ATTR
from fxviz.torchbridge.guard import Snapshot, walks_shared
from fxviz.torchbridge.loggers import clear_torch_caches, torch_loggers, with_levels
from fxviz.torchbridge.memory import give_back_memory
from fxviz.torchbridge.source import error_location

_MAX_MESSAGE = 4000
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

#: One capture at a time in a process. fx patches ``nn.Module.__call__`` for the whole process
#: while it traces, export sets process-wide flags, the eager tracer registers global module hooks
#: and replaces ``sys.stderr``'s writer: two captures interleaving in two threads would undo each
#: other's patches (a capture that restores the "original" another one patched leaves the patch in
#: place). Reentrant: a capture may run inside another's forward on the same thread.
CAPTURE_LOCK = threading.RLock()


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
    if not args and not kwargs:
        needs = required_inputs(model)
        if needs:
            raise InputError(
                f"{type(model).__name__}.forward needs {', '.join(needs)}: pass example inputs as torch.export "
                f"takes them, e.g. fxviz.capture(model, ({needs[0]},)) with {needs[0]} a tensor of the shape it expects")
    return args, kwargs


def required_inputs(model: nn.Module) -> list[str]:
    """The parameters of ``model.forward`` that have no default (``[]`` where its signature cannot
    be read, as for a C++ or wrapped forward)."""
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in sig.parameters.values() if p.kind in kinds and p.default is inspect.Parameter.empty]


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
    """The record of an attempt that raised ``exc``: its type, message (bounded) and the user's
    line. An exception relayed from an attempt run apart carries the record made where it was
    raised, with the source line its traceback had (``ATTEMPT_ATTR``)."""
    made = getattr(exc, ATTEMPT_ATTR, None)
    if isinstance(made, Attempt):
        return dataclasses.replace(made, method=method, seconds=seconds)
    message = _ANSI.sub("", str(exc)).strip()
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + " ..."
    return Attempt(method, False, seconds, type(exc).__name__, message, error_location(exc))


# ---- Ctrl-C ----------------------------------------------------------------------------------------


class _Interrupts:
    """Ctrl-C during a capture always ends it with :class:`KeyboardInterrupt`.

    Python raises ``KeyboardInterrupt`` wherever the main thread happens to be when SIGINT
    arrives; inside a weak-reference callback or a ``__del__`` (torch runs many while it traces)
    the exception is printed as "Exception ignored in ..." and dropped, and the capture went on
    to print a graph and exit 0. While a capture runs, SIGINT is recorded as well as raised, and
    the capture raises it again at the end of each attempt and of the capture if it was lost on
    the way. Only Python's default handler is replaced, and only on the main thread (where
    signal handlers run); a program with its own SIGINT handler keeps it."""

    def __init__(self) -> None:
        self.depth = 0
        self.hit = False
        self.previous: Any = None

    def _handler(self, signum: int, frame: types.FrameType | None) -> None:
        self.hit = True
        raise KeyboardInterrupt

    def check(self) -> None:
        """Raise the interrupt if one arrived (and was perhaps swallowed) since the capture began."""
        if self.hit:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def kept(self) -> Iterator[None]:
        main = threading.current_thread() is threading.main_thread()
        if not main:
            yield
            return
        if self.depth == 0:
            self.hit = False
            self.previous = None
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                self.previous = signal.signal(signal.SIGINT, self._handler)
        self.depth += 1
        try:
            yield
        except KeyboardInterrupt:
            self.hit = False
            raise
        except BaseException as e:
            if self.hit:  # the interrupt became another error on its way out: it is still Ctrl-C
                self.hit = False
                raise KeyboardInterrupt from e
            raise
        finally:
            self.depth -= 1
            if self.depth == 0 and self.previous is not None:
                signal.signal(signal.SIGINT, self.previous)
                self.previous = None
        if self.hit:
            self.hit = False
            raise KeyboardInterrupt


_INTERRUPTS = _Interrupts()


def interrupts_kept() -> contextlib.AbstractContextManager[None]:
    """The block ends with :class:`KeyboardInterrupt` if Ctrl-C was pressed while it ran, even when
    the interrupt was swallowed on the way (see :class:`_Interrupts`)."""
    return _INTERRUPTS.kept()


# ---- torch's noise ----------------------------------------------------------------------------------

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_STDLIB_DIR = os.path.dirname(os.__file__) + os.sep
#: Torch's own text held during one attempt at most; what is beyond is counted, not kept.
_MAX_HELD = 64 * 1024


def _from_torch(frame: types.FrameType | None) -> bool:
    """Whether the code writing is torch's: the first frame outside the standard library and
    ``typing_extensions`` (``print``, ``traceback``, ``warnings``, ``copy`` and the ``deprecated``
    decorator are how torch's messages get written) is in torch's package."""
    for _ in range(64):
        if frame is None:
            return False
        file = frame.f_code.co_filename
        if not (file.startswith(_STDLIB_DIR) or file.endswith("typing_extensions.py")):
            return file.startswith(_TORCH_DIR)
        frame = frame.f_back
    return False


class Held:
    """Torch's own messages held back during one attempt, bounded: ``text`` keeps at most
    ``_MAX_HELD`` characters, ``dropped`` counts the rest."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.size = 0
        self.dropped = 0

    def add(self, s: str) -> None:
        if self.size + len(s) <= _MAX_HELD:
            self.text.append(s)
            self.size += len(s)
        else:
            self.dropped += len(s)


class _SortedStderr:
    """``sys.stderr`` while an attempt runs: what torch writes is held, what anything else writes
    (the model's own prints) goes through to the real stream at once."""

    def __init__(self, stream: TextIO, held: Held) -> None:
        self._stream = stream
        self._held = held

    def write(self, s: str) -> int:
        if _from_torch(sys._getframe(1)):
            self._held.add(s)
            return len(s)
        return self._stream.write(s)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def quiet_torch() -> Iterator[Held]:
    """Hold torch's own noise while an attempt runs (a failed attempt is reported once, by fxviz,
    in ``graph.attempts``); the model's own prints and warnings reach the user as they are made.

    * Torch's loggers: a logger without a level of its own inherits its parent's, so raising
      ``torch`` and the few ``torch.*`` loggers torch gave a level of their own silences them all
      (each ``setLevel`` clears every logger's cache: doing it for all ~100 cost a millisecond
      per capture); levels are restored afterwards. Not torch's structured trace
      (``torch.__trace``): it prints nothing (it does not propagate) and writes only to its own
      handlers, a user's ``TORCH_TRACE`` file among them, which must keep the run's records.
    * stderr: export prints a data-dependent error's partial graph straight to it. Writes from
      torch's code are held; others go through (:class:`_SortedStderr`).
    * warnings torch's code makes are held; the model's go to the usual warning machinery, filters
      and "once per location" included.

    Held text is bounded (:class:`Held`) and dropped with the attempt."""
    held = Held()
    root = logging.getLogger("torch")
    loggers = [root] + [lg for lg in with_levels(torch_loggers()[1]) if lg is not root and lg.name != _TRACE_LOG]
    levels = [lg.level for lg in loggers]
    _set_levels(loggers, [logging.CRITICAL] * len(loggers))
    stderr = sys.stderr
    show = warnings.showwarning

    def showwarning(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
                    line: Any = None) -> None:
        # torch's by where it points, or by who called ``warnings.warn`` (torch often points its
        # warnings at its caller: ``contextlib.py``, ``copyreg.py``)
        if filename.startswith(_TORCH_DIR) or _from_torch(sys._getframe(1)):
            held.add(f"{filename}:{lineno}: {category.__name__}: {message}\n")
        elif show is _SHOWWARNING:  # through warnings' own machinery: catch_warnings(record=True) sees it
            # (looked up now: catch_warnings(record=True) puts its list's append there)
            warnings._showwarnmsg_impl(  # type: ignore[attr-defined]
                warnings.WarningMessage(message, category, filename, lineno, file, line))
        else:
            show(message, category, filename, lineno, file, line)

    sys.stderr = _SortedStderr(stderr, held)  # type: ignore[assignment]
    warnings.showwarning = showwarning
    try:
        yield held
    finally:
        if isinstance(sys.stderr, _SortedStderr):
            sys.stderr = stderr
        if warnings.showwarning is showwarning:
            warnings.showwarning = show
        _set_levels(loggers, levels)


#: torch's structured-trace logger: "always at debug level" (torch/_logging/_internal.py).
_TRACE_LOG = "torch.__trace"


def _set_levels(loggers: list[logging.Logger], levels: list[int]) -> None:
    """``lg.setLevel(level)`` for each pair of torch's loggers, with one clearing of their caches
    for all (each ``setLevel`` clears every logger's cache: ~40 us each with transformers' ~400
    loggers; only torch's depend on these levels)."""
    for lg, level in zip(loggers, levels, strict=True):
        lg.level = logging._checkLevel(level)  # type: ignore[attr-defined]
    clear_torch_caches()


_SHOWWARNING = warnings.showwarning


# ---- one capture -----------------------------------------------------------------------------------


class Session:
    """One capture: the model, its inputs and the process as they were before the first attempt."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        #: an attempt ran torch's symbolic machinery in this process (export, fx), whose garbage
        #: the capture gives back at its end; the eager tracer leaves nothing a forward does not
        self.borrowed = False

    @contextlib.contextmanager
    def attempt(self) -> Iterator[Held]:
        """One attempt: torch's noise held, and afterwards, however it ends, the model, the inputs
        and the process put back as the session found them, and a Ctrl-C that arrived raised."""
        before = set(threading.enumerate())
        try:
            with quiet_torch() as held:
                yield held
        finally:
            _join_started(before)
            self.snapshot.restore()
            _INTERRUPTS.check()


#: How long an attempt waits for the threads the model's forward started and left running (a
#: forward that raised before it joined its worker): they may still write into the model.
THREAD_WAIT_S = 5.0


def _join_started(before: set[threading.Thread]) -> None:
    """Wait (bounded) for the non-daemon threads started during an attempt to finish, so that the
    model is restored after they stopped touching it, not while they still run."""
    deadline = time.monotonic() + THREAD_WAIT_S
    for t in threading.enumerate():
        if t not in before and not t.daemon and t is not threading.current_thread():
            t.join(max(0.0, deadline - time.monotonic()))


@contextlib.contextmanager
def deep_enough() -> Iterator[None]:
    """Raise Python's recursion limit while a capture runs, so that a model nested as deep as its
    plain forward can run is captured too: a plain forward spends about 4 frames per level of
    module nesting, the eager tracer 5, fx 7, export 8, strict export 5.3 above ~900 frames of
    Dynamo's own (measured on torch 2.13). Twice the limit plus 1,500 covers each; the limit is
    put back afterwards."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 2 * limit + 1500))
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


@contextlib.contextmanager
def capture_session(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[Session]:
    """Hold the process-wide capture lock, keep Ctrl-C, allow the recursion a deep model needs,
    take the snapshot every attempt is restored from, and give back memory the attempts borrowed
    when the capture ends."""
    with CAPTURE_LOCK, interrupts_kept(), deep_enough(), walks_shared():
        snapshot = Snapshot(model, [args, kwargs])
        session = Session(snapshot)
        try:
            yield session
        finally:
            # the snapshot (a copy of every module's dicts, an alias of every tensor) is freed first,
            # by reference counting: the collection below walks only what the attempts left
            del snapshot, session.snapshot
            # the collector is paused while a capture runs (``gc_paused``): the cycles its attempts
            # left (export's graph modules, fake tensors, frames) are freed here, so that the heap
            # they sat on can be given back. Only the young generation, which holds everything the
            # capture allocated: a full collection walks all of torch and transformers (0.2 s)
            gc.collect(0)
            if session.borrowed:  # not after an eager trace: trimming the heap a forward just freed
                give_back_memory()  # cost 4-16 ms on GPT-2, and its next forward faults pages in again


__all__ = [
    "CAPTURE_LOCK", "Held", "Session", "capture_session", "deep_enough", "failed_attempt", "gc_paused",
    "interrupts_kept", "normalize_args", "quiet_torch",
]
